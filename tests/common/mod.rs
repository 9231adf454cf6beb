//! What the command's test files share: reading a run's output as a success or a failure.

use std::process::Output;

/// The stdout of a run that must succeed (its stderr in the failure message).
pub fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// The stderr of a run that must fail (its stdout in the failure message).
pub fn err(o: &Output) -> String {
    assert!(!o.status.success(), "should fail: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8(o.stderr.clone()).unwrap()
}
