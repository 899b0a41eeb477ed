fn main() {
    std::process::exit(berth::edges::cli::main());
}
