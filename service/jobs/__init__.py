"""Jobs: ``POST /optimize`` and the upload it streams, submission (quota, idempotency, whole-job cache),
state, progress, cancellation, artifacts and the bundle, gates, and the hand-off to the workers."""
