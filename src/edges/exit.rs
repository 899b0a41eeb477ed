//! How a command ends: its exit code and the text it prints on stderr. One function, so that
//! `berth up` prints the same thing whether it ran the work itself or `berth serve` ran it for
//! it ([`crate::edges::control`]).

use crate::core::source::file::ConfigErrors;

/// Bad input that is not in the config file (an `--ir` file, an `--xds-*` flag): exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// An end decided elsewhere (by `berth serve`, for a request handed to it): printed as it is,
/// with its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{text}")]
pub struct Relayed {
    pub code: i32,
    pub text: String,
}

/// The exit code `e` means (2 for bad input: nothing was changed; 1 otherwise) and what is
/// printed for it.
pub fn report(e: &anyhow::Error) -> (i32, String) {
    if let Some(r) = e.downcast_ref::<Relayed>() {
        (r.code, r.text.clone())
    } else if let Some(bad) = e.downcast_ref::<BadInput>() {
        (2, format!("error: {bad}; nothing was changed"))
    } else if let Some(errors) = e.downcast_ref::<ConfigErrors>() {
        (
            2,
            format!(
                "{errors}\nerror: {} problem(s) in the config; nothing was changed",
                errors.0.len()
            ),
        )
    } else {
        (1, format!("error: {e:#}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_end_is_printed_as_it_came() {
        let e = anyhow::Error::new(Relayed {
            code: 1,
            text: "error: rollout of edge failed".into(),
        });
        assert_eq!(report(&e), (1, "error: rollout of edge failed".into()));
        let bad = anyhow::Error::new(BadInput("--ir x.json: no such file".into()));
        assert_eq!(
            report(&bad),
            (
                2,
                "error: --ir x.json: no such file; nothing was changed".into()
            )
        );
        assert_eq!(report(&anyhow::anyhow!("boom")).0, 1);
    }
}
