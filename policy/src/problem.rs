//! A problem found in a document (a manifest, a context pack), located by a field path such as
//! `controls.policy.text` or `items[3].source`; an empty field means the document as a whole.

use std::fmt;

/// One problem, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where, as a JSON path; empty for the whole document.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Problem {
    /// A problem at `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem { field: field.into(), message: message.into() }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}
