//! todo
use crate::{report::Checks, Mode};
pub(crate) fn run(_m: Mode) -> Result<Checks, tower::BoxError> { Ok(Checks::default()) }
