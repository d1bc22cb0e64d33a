//! Delegated authentication and authorization of HTTP requests, as the
//! secure port of kube-controller-manager does: the bearer token is
//! reviewed by the API server (TokenReview), then the API server is asked
//! whether that user may `get` the requested non-resource URL
//! (SubjectAccessReview). Verdicts are cached for 10 s, as the API server's
//! delegating authenticator and authorizer do, and the reviews have a
//! budget of their own so that a flood of scrapes with made-up tokens can
//! neither starve the controller's requests nor grow its memory.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tracing::debug;

/// How long a verdict is reused for the same token and path.
pub const VERDICT_TTL: Duration = Duration::from_secs(10);
/// Verdicts held at most; beyond, expired ones go, then all.
const MAX_VERDICTS: usize = 1024;
/// Reviews (TokenReview plus SubjectAccessReview) per second, and burst.
pub const REVIEWS_PER_SECOND: u32 = 5;
const REVIEWS_BURST: u32 = 20;

/// What the gate says about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No token, or one the API server does not accept (401).
    Unauthenticated(String),
    /// A known user without the right (403).
    Forbidden(String),
    /// No verdict could be had: reviews over budget or failing (503).
    Unavailable(String),
}

/// Authenticates and authorizes requests through the API server.
pub struct Gate {
    client: kube::Client,
    verdicts: Mutex<HashMap<(String, String), (Verdict, Instant)>>,
    reviews: DefaultDirectRateLimiter,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
pub(crate) fn bearer_token(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Gate {
    pub fn new(client: kube::Client) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(REVIEWS_PER_SECOND).expect("non-zero"))
            .allow_burst(NonZeroU32::new(REVIEWS_BURST).expect("non-zero"));
        Gate {
            client,
            verdicts: Mutex::new(HashMap::new()),
            reviews: RateLimiter::direct(quota),
        }
    }

    /// The verdict on a `GET path` carrying `token`.
    pub async fn check(&self, token: Option<&str>, path: &str) -> Verdict {
        let Some(token) = token else {
            return Verdict::Unauthenticated("no bearer token".into());
        };
        let key = (token.to_owned(), path.to_owned());
        if let Some(verdict) = self.cached(&key) {
            return verdict;
        }
        if self.reviews.check().is_err() {
            return Verdict::Unavailable("too many token reviews; try again shortly".into());
        }
        let verdict = self.review(token, path).await;
        if !matches!(verdict, Verdict::Unavailable(_)) {
            self.remember(key, verdict.clone());
        }
        verdict
    }

    fn cached(&self, key: &(String, String)) -> Option<Verdict> {
        let verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        verdicts
            .get(key)
            .filter(|(_, at)| at.elapsed() < VERDICT_TTL)
            .map(|(v, _)| v.clone())
    }

    fn remember(&self, key: (String, String), verdict: Verdict) {
        let mut verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        if verdicts.len() >= MAX_VERDICTS {
            verdicts.retain(|_, (_, at)| at.elapsed() < VERDICT_TTL);
            if verdicts.len() >= MAX_VERDICTS {
                verdicts.clear();
            }
        }
        verdicts.insert(key, (verdict, Instant::now()));
    }

    async fn review(&self, token: &str, path: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(reviewed) => reviewed,
            Err(err) => return Verdict::Unavailable(format!("TokenReview failed: {err}")),
        };
        let status = reviewed.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            let why = status.error.unwrap_or_else(|| "token not accepted".into());
            debug!(reason = %why, "metrics request not authenticated");
            return Verdict::Unauthenticated(why);
        };
        let username = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
        {
            Err(err) => Verdict::Unavailable(format!("SubjectAccessReview failed: {err}")),
            Ok(answer) => {
                let status = answer.status.unwrap_or_default();
                if status.allowed {
                    Verdict::Allowed
                } else {
                    let reason = status.reason.unwrap_or_default();
                    debug!(user = %username, path, reason = %reason, "metrics request forbidden");
                    Verdict::Forbidden(format!(
                        "user \"{username}\" may not get path \"{path}\"; bind it to the \
                         metrics-reader ClusterRole of the chart (nonResourceURLs [\"/metrics\"], \
                         verb get)"
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        let rows = [
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
            (Some("Basic abc"), None),
            (Some("Bearer "), None),
            (Some("Bearer"), None),
            (None, None),
        ];
        for (header, want) in rows {
            assert_eq!(bearer_token(header), want, "{header:?}");
        }
    }
}
