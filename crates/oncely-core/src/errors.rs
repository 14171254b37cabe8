//! Error text, and the one boxed error type of the workspace.

/// Any error, boxed: what bodies, services and streams carry (every crate re-uses this
/// one).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error with its sources, `a: b: c`: what a failed call is logged and reported as (a
/// hyper-util error alone says only "client error (Connect)", a PostgreSQL one only "db
/// error").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn every_source_is_named_in_order() {
        let e = Layer(
            "client error",
            Some(Box::new(Layer(
                "connect",
                Some(Box::new(Layer("refused", None))),
            ))),
        );
        assert_eq!(error_chain(&e), "client error: connect: refused");
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
