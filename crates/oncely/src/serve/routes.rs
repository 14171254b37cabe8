//! The route table: method + path pattern, first match wins. The tower layer matches a
//! request once ([`RoutePolicies`]) and puts the route's policy in the request's
//! extensions; the policy carries what the proxy needs to send it (its [`Target`]: the
//! upstream and the retries) and the route's concurrency slots, so the proxy never
//! matches again. Before that, [`RouteTable::normalize`] puts the request's path in its
//! one normalised form (`crate::config::normalize_path`), which is matched and forwarded
//! alike.

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response};
use oncely_http::problem::ONCELY_STATUS;
use oncely_tower::Concurrency;
use oncely_tower::{BoxBody, Problem, ProblemCode, RoutePolicies, RoutePolicy};

use crate::config::{Config, Route, Upstream};
use crate::upstream::retry::RetryPolicy;
use crate::upstream::Target;

/// One configured route, resolved.
#[derive(Debug)]
struct Entry {
    route: Route,
    policy: Arc<RoutePolicy>,
}

/// The routes of a config, in order, and the default upstream. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct RouteTable {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    entries: Vec<Entry>,
    default_upstream: Option<Upstream>,
    /// `[defaults]`'s `errors`, for requests that match no route.
    errors: oncely_tower::Dialect,
}

/// The guard policy of a configured route, with `concurrency` as its slots and what the
/// proxy needs to send its requests attached.
pub fn policy(route: &Route, config: &Config, concurrency: Option<Concurrency>) -> RoutePolicy {
    let mut p = RoutePolicy::new(route.name.clone(), route.class);
    p.key = Arc::new(route.key);
    p.principal = Arc::new(route.principal.clone());
    p.fingerprint_headers = route.fingerprint_headers.clone();
    p.ignore_fields = route.ignore_fields.clone();
    p.fingerprint_fields = route.fingerprint_fields.clone();
    p.guard_when = route.guard_when.clone();
    p.units = Arc::new(route.units.clone());
    p.window = route.window;
    p.wait = route.wait;
    p.churn_window = route.churn_window;
    p.lease = route.lease;
    p.timeout = route.timeout;
    p.max_body = config.max_body;
    p.max_response = config.max_response;
    p.concurrency = concurrency;
    p.answer_before_record = route.answer_before_record;
    p.errors = route.errors;
    if let Some(upstream) = route.upstream.clone().or_else(|| config.upstream.clone()) {
        p.attached.insert(Target {
            upstream,
            retry: RetryPolicy::of(route, config.max_body).map(Arc::new),
        });
    }
    p
}

impl RouteTable {
    /// The table of a config.
    pub fn new(config: &Config) -> RouteTable {
        RouteTable::reloaded(config, None)
    }

    /// The table of a config read again: a route of the same name and `concurrency` as
    /// one of `previous` shares its limit, so the calls still running on the old table
    /// count against the new one.
    pub fn reloaded(config: &Config, previous: Option<&RouteTable>) -> RouteTable {
        let kept = |r: &Route| -> Option<Concurrency> {
            let old = previous?
                .inner
                .entries
                .iter()
                .find(|e| e.route.name == r.name && e.route.concurrency == r.concurrency)?;
            old.policy.concurrency.clone()
        };
        RouteTable {
            inner: Arc::new(Inner {
                entries: config
                    .routes
                    .iter()
                    .map(|r| {
                        let slots = kept(r).or_else(|| r.concurrency.map(Concurrency::new));
                        Entry {
                            route: r.clone(),
                            policy: Arc::new(policy(r, config, slots)),
                        }
                    })
                    .collect(),
                default_upstream: config.upstream.clone(),
                errors: config.errors,
            }),
        }
    }

    /// The path pattern of the route `method` and `path` match, as the config writes it
    /// (OpenTelemetry's `http.route`).
    pub fn route_path(&self, method: &Method, path: &str) -> Option<&str> {
        self.find(method, path).map(|e| e.route.path.as_str())
    }

    fn find(&self, method: &Method, path: &str) -> Option<&Entry> {
        self.inner
            .entries
            .iter()
            .find(|e| e.route.method.matches(method) && e.route.path.matches(path))
    }

    /// Where a request that matches no route goes: the default upstream, without
    /// retries.
    pub fn default_target(&self) -> Option<Target> {
        self.inner.default_upstream.clone().map(|upstream| Target {
            upstream,
            retry: None,
        })
    }

    /// Whether a route that guards (any class but `read`) takes `method`. Methods are
    /// compared as HTTP says: case-sensitive tokens (`post` is not `POST`).
    pub fn guards_method(&self, method: &Method) -> bool {
        self.inner
            .entries
            .iter()
            .any(|e| e.route.class != oncely_core::Class::Read && e.route.method.matches(method))
    }

    /// The request with its path in the normalised form every later step (MCP and
    /// webhook endpoints, route matching, fingerprint, forwarding) sees. A path with no
    /// unambiguous form (`%2F`, a bad escape) is answered 400 `path_invalid` when a
    /// guarding route takes the method, so it is never forwarded unguarded; any other
    /// such request is forwarded as it came.
    #[allow(clippy::result_large_err)]
    pub fn normalize<B>(&self, mut req: Request<B>) -> Result<Request<B>, Response<BoxBody>> {
        let refused = |method: &Method, why: String| {
            let mut res =
                Problem::new(ProblemCode::PathInvalid, why).into_response_in(self.inner.errors);
            res.headers_mut()
                .insert(ONCELY_STATUS, HeaderValue::from_static("path_invalid"));
            tracing::info!(%method, "refused a request whose path has no normalised form");
            res
        };
        let normal = match crate::config::normalize_path(req.uri().path()) {
            Ok(Cow::Borrowed(_)) => return Ok(req),
            Ok(Cow::Owned(p)) => p,
            Err(e) if self.guards_method(req.method()) => {
                return Err(refused(req.method(), e.to_string()))
            }
            Err(_) => return Ok(req),
        };
        let target = match req.uri().query() {
            Some(q) => format!("{normal}?{q}"),
            None => normal,
        };
        let mut parts = req.uri().clone().into_parts();
        match target.parse() {
            Ok(pq) => parts.path_and_query = Some(pq),
            Err(e) => return Err(refused(req.method(), format!("the path is not valid: {e}"))),
        }
        match http::Uri::from_parts(parts) {
            Ok(uri) => *req.uri_mut() = uri,
            Err(e) => return Err(refused(req.method(), format!("the path is not valid: {e}"))),
        }
        Ok(req)
    }

    /// The policies of the `job` routes (their queued jobs are run by the job worker).
    pub fn job_policies(&self) -> Vec<Arc<RoutePolicy>> {
        self.inner
            .entries
            .iter()
            .filter(|e| e.route.class == oncely_core::Class::Job)
            .map(|e| e.policy.clone())
            .collect()
    }

    /// The routes' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.entries.iter().map(|e| e.route.name.as_str())
    }
}

impl RoutePolicies for RouteTable {
    fn policy(&self, method: &Method, path: &str) -> Option<Arc<RoutePolicy>> {
        self.find(method, path).map(|e| e.policy.clone())
    }

    fn default_errors(&self) -> oncely_tower::Dialect {
        self.inner.errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    #[test]
    fn first_match_wins_and_picks_the_upstream() {
        let config = Config::resolve(
            r#"
upstream = "http://127.0.0.1:1"
max_body = "1KiB"
[[routes]]
method = "POST"
path = "/v1/render"
class = "action"
upstream = "http://127.0.0.1:2"
concurrency = 2
units = "json:/text"
[[routes]]
method = "*"
path = "/v1/{*rest}"
class = "read"
"#,
            None,
            &Overrides::default(),
        )
        .unwrap();
        let t = RouteTable::new(&config);
        let p = t.policy(&Method::POST, "/v1/render").unwrap();
        assert_eq!(p.name, "POST /v1/render");
        assert_eq!(p.class, oncely_core::Class::Action);
        assert_eq!(p.max_body, 1024);
        let headers = http::HeaderMap::new();
        let head = oncely_tower::RequestHead {
            method: &Method::POST,
            target: "/v1/render",
            headers: &headers,
        };
        assert_eq!(p.units.request_units(&head, br#"{"text":"abc"}"#), 3);
        let target = p.attached.get::<Target>().unwrap();
        assert_eq!(target.upstream.uri.port_u16(), Some(2));
        assert_eq!(p.concurrency.as_ref().unwrap().slots.available_permits(), 2);

        let p = t.policy(&Method::GET, "/v1/render").unwrap();
        assert_eq!(p.name, "* /v1/{*rest}");
        let target = p.attached.get::<Target>().unwrap();
        assert_eq!(
            target.upstream.uri.port_u16(),
            Some(1),
            "the default upstream"
        );
        assert!(p.concurrency.is_none());

        assert!(t.policy(&Method::POST, "/other").is_none());
        let other = t.default_target().unwrap();
        assert_eq!(other.upstream.uri.port_u16(), Some(1));
        assert!(other.retry.is_none(), "no route, no retries");
    }
}
