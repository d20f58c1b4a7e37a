//! [`Diagnostic`] and [`Diagnostics`]: the errors of loading a definitions directory.
//!
//! Loading never stops at the first problem: every file is checked and every problem becomes a
//! `Diagnostic` naming file, line and column, carrying the offending source line so that it can be
//! rendered rustc-style without reading the file again. The rendering is plain text with no
//! colours, because it is also what the snapshot tests compare.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in one definition file.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    /// The file (or, for a missing file, the directory), joined onto the directory given to
    /// [`load_dir`](crate::load_dir).
    pub file: PathBuf,
    /// 1-based line; 0 when the problem has no position (a missing file).
    pub line: usize,
    /// 1-based character column; 0 when the problem has no position.
    pub column: usize,
    /// What is wrong and what was expected, lowercase, no trailing period.
    pub message: String,
    /// The text of line `line`, without its terminator (empty when `line` is 0).
    pub source_line: String,
    /// How many characters the caret underlines (at least 1 when rendered).
    pub len: usize,
}

impl Diagnostic {
    /// A diagnostic about a whole file or directory, with no position inside it.
    pub(crate) fn file(file: &Path, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            message: message.into(),
            source_line: String::new(),
            len: 0,
        }
    }

    /// A diagnostic at `line`:`column` (1-based, characters) of `text`, the content of `file`.
    pub(crate) fn at(
        file: &Path,
        text: &str,
        line: usize,
        column: usize,
        len: usize,
        message: impl Into<String>,
    ) -> Diagnostic {
        let source_line = text
            .lines()
            .nth(line.saturating_sub(1))
            .unwrap_or_default()
            .trim_end_matches('\r')
            .to_owned();
        Diagnostic {
            file: file.to_path_buf(),
            line,
            column: column.max(1),
            message: message.into(),
            source_line,
            len: len.max(1),
        }
    }
}

impl fmt::Display for Diagnostic {
    /// Renders rustc-style:
    ///
    /// ```text
    /// error: unknown column `BASEE` in datastore `trips` (expected one of BASE, STATUS)
    ///  --> datastores/trips/indexes/foo.yaml:5:17
    ///   |
    /// 5 |   - column_key: BASEE
    ///   |                 ^^^^^
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        if self.line == 0 {
            return write!(f, " --> {}", self.file.display());
        }
        let gutter = " ".repeat(self.line.to_string().len());
        writeln!(
            f,
            "{gutter}--> {}:{}:{}",
            self.file.display(),
            self.line,
            self.column
        )?;
        writeln!(f, "{gutter} |")?;
        writeln!(f, "{} | {}", self.line, self.source_line)?;
        // Keep tabs from the source so the caret lines up however the terminal expands them.
        let pad: String = self
            .source_line
            .chars()
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .chain(std::iter::repeat(' '))
            .take(self.column.saturating_sub(1))
            .collect();
        write!(f, "{gutter} | {pad}{}", "^".repeat(self.len.max(1)))
    }
}

/// Every problem found while loading a definitions directory, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// The number of distinct files with problems.
    pub fn file_count(&self) -> usize {
        let mut files: Vec<&Path> = self.0.iter().map(|d| d.file.as_path()).collect();
        files.sort();
        files.dedup();
        files.len()
    }
}

impl fmt::Display for Diagnostics {
    /// Renders every diagnostic, separated by blank lines, then a summary line
    /// (`error: could not load definitions: 3 errors in 2 files`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.0 {
            writeln!(f, "{d}")?;
            writeln!(f)?;
        }
        let errors = self.0.len();
        let files = self.file_count();
        write!(
            f,
            "error: could not load definitions: {errors} error{} in {files} file{}",
            if errors == 1 { "" } else { "s" },
            if files == 1 { "" } else { "s" },
        )
    }
}

impl std::error::Error for Diagnostics {}
