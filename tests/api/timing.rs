//! What the stall tests measure (docs/contract.md "When the storage is slow"): requests sent at once, each one's status,
//! `Retry-After` and time to its answer; whether each came by the deadline; and how long a
//! probe took to turn.

use std::time::{Duration, Instant};

use reqwest::{Client, RequestBuilder, StatusCode};

/// What a request may take past its deadline (docs/contract.md "When the storage is slow"'s "deadline + 1 s").
pub const SLACK: Duration = Duration::from_secs(1);

/// One answer: the request's idempotency key, the status, `Retry-After`, the time it took.
pub type Answer = (String, StatusCode, Option<String>, Duration);

/// Sends every request at once, each under its key; each one's answer.
pub async fn at_once(requests: Vec<(String, RequestBuilder)>) -> Vec<Answer> {
    let sent = requests.into_iter().map(|(key, request)| async move {
        let started = Instant::now();
        let resp = request.send().await.expect("orderly answers");
        let retry_after = resp
            .headers()
            .get("Retry-After")
            .map(|v| v.to_str().unwrap().to_string());
        (key, resp.status(), retry_after, started.elapsed())
    });
    futures::future::join_all(sent).await
}

pub fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Each answer came by the deadline, and was one of `allowed`; a 503 says when to retry.
pub fn assert_answered_by(deadline: Duration, answers: &[Answer], allowed: &[StatusCode]) {
    for (key, status, retry_after, took) in answers {
        assert!(*took <= deadline + SLACK, "{key} answered after {took:?}");
        assert!(
            allowed.contains(status),
            "{key}: {status}, not one of {allowed:?}"
        );
        if *status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(retry_after.as_deref(), Some("1"), "{key}");
        }
    }
}

/// Polls `url` until it answers `status`, for at most `within`; how long it took.
pub async fn until_status(
    client: &Client,
    url: String,
    status: StatusCode,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let answered = client.get(&url).send().await.unwrap().status();
        if answered == status {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{url} did not answer {status} within {within:?} (it answers {answered})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
