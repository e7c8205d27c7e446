//! What stops a command of the binary before anything could be decided, and its exit code.

/// A failure before anything could be decided: bad usage (2) or a broken journal (1).
pub(crate) enum Failure {
    Usage(String),
    Runtime(String),
}

impl From<orderly_client::Error> for Failure {
    fn from(e: orderly_client::Error) -> Failure {
        match e {
            orderly_client::Error::InvalidIntent(e) => Failure::Usage(e.to_string()),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

impl From<orderly_client::JournalError> for Failure {
    fn from(e: orderly_client::JournalError) -> Failure {
        Failure::Runtime(e.to_string())
    }
}
