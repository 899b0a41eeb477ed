//! A config file's problems, each with file, line, column and field.

use std::fmt;
use std::path::PathBuf;

/// One problem in a config file. `line` and `column` are 1-based (0 only when the file could not
/// be read at all) and point at the offending value, or at the key when the key is the problem.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    /// Dotted path such as `proxy[0].listener[1].port`; `syntax` for TOML syntax errors, `file`
    /// when the file cannot be read.
    pub field: String,
    /// What is wrong and what is allowed. Never contains a newline.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.field,
            self.message
        )
    }
}

/// All problems found in a config file, in file order. Displayed one per line.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
