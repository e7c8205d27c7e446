//! `GET /admin/backup`: a consistent snapshot of everything, streamed in the backup format of
//! `crate::backup` while the server goes on serving. Writes wait neither for the cut (on
//! sled, a writer job of microseconds, then a walk outside the writer) nor for the stream; the
//! header line goes as soon as the instant is taken, and a stream that fails midway ends
//! without its end record, so the partial file is refused by `orderly restore`.

use crate::bounds::Deadline;
use actix_web::web::Bytes;
use actix_web::HttpResponse;
use tokio::sync::mpsc;

use super::extract::Admin;
use super::respond::StoreData;
use crate::domain::time::now_millis;
use crate::error::ApiError;
use crate::store::backup_file::Writer;

/// Bytes sent per chunk of the stream.
const CHUNK: usize = 64 * 1024;
/// The share of one core a backup's encoding (and so its reading, which waits for it) takes.
const BACKUP_SHARE: f64 = 0.5;

#[utoipa::path(
    get, path = "/admin/backup", tag = "admin", summary = "Stream a consistent backup",
    responses((status = 200, description = "The backup: JSON lines, a header first and an end record with counts and SHA-256 last", content_type = "application/octet-stream", body = String)),
    security(("admin_token" = []))
)]
pub(crate) async fn backup(
    _admin: Admin,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let mut snapshot = store.snapshot(deadline).await?;
    let (chunks, received) = mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    // Encoding is CPU work over records already cut: off the executor, at the reader's pace,
    // and behind the requests in the CPU's queue.
    crate::background::spawn_idle("orderly-backup-encode", move || {
        let (mut writer, header) = Writer::start(now_millis());
        // The header goes at once: the status and the first bytes are the client's within the
        // deadline (docs/contract.md "When the storage is slow"), however long the walk before the first record takes.
        if chunks.blocking_send(Ok(header.into())).is_err() {
            return;
        }
        let mut chunk = Vec::new();
        let mut pace = crate::background::Pace::at(BACKUP_SHARE);
        while let Some(record) = snapshot.blocking_next() {
            match record {
                Ok(record) => chunk.extend(writer.record(record)),
                Err(e) => {
                    log::error!("backup stopped: {e}");
                    let _ = chunks.blocking_send(Err(std::io::Error::other("backup failed")));
                    return;
                }
            }
            if chunk.len() >= CHUNK {
                if chunks
                    .blocking_send(Ok(std::mem::take(&mut chunk).into()))
                    .is_err()
                {
                    return; // the client went away
                }
                pace.rest();
            }
        }
        chunk.extend(writer.finish());
        let _ = chunks.blocking_send(Ok(chunk.into()));
    });
    let stream = futures_util::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|chunk| (chunk, received))
    });
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header((
            "Content-Disposition",
            "attachment; filename=\"orderly.backup\"",
        ))
        .streaming(stream))
}
