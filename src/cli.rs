//! The command line: parse arguments, call the library, print.

/// Runs berth with the process arguments and returns the exit code.
pub fn main() -> i32 {
    0
}
