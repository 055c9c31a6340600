//! Fenced writes to objects (S3, GCS, `file://`), their write ids, and the proof of preconditions an object store must give before it is used.

mod gcs_tokens;
mod object_ids;
mod objects;
mod preconditions;
mod redirects;
mod review15;
