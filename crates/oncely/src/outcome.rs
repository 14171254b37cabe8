//! What a command returns: success, or a failure with its one-line reason and exit code
//! (2 for a bad argument or config, 1 for a runtime failure). Every command (`cli`,
//! `serve`, `demo`) returns it, and only `cli::main` turns it into an exit code.

/// A command's failure: what to print (one line) and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// The one-line reason.
    pub message: String,
}

impl Failure {
    /// A usage error (exit 2).
    pub fn usage(message: impl std::fmt::Display) -> Failure {
        Failure {
            code: 2,
            message: message.to_string(),
        }
    }

    /// A runtime failure (exit 1).
    pub fn runtime(message: impl std::fmt::Display) -> Failure {
        Failure {
            code: 1,
            message: message.to_string(),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::usage(format!("{e:#}"))
    }
}

/// What a command returns.
pub type Outcome = Result<(), Failure>;
