//! A kube-rs client for the benchmarks' in-process API server.

/// A client of the API server at `url` whose `User-Agent` is `agent`, without a read timeout.
///
/// Why: the server counts requests per `User-Agent`, so each simulated process gets its own
/// name; and watches in the benchmarks outlive kube's default read timeout.
pub fn kube_client(url: &str, agent: &str) -> kube::Client {
    let mut config = kube::Config::new(url.parse().expect("a URL"));
    config.headers.push((http::header::USER_AGENT, agent.parse().expect("a header value")));
    config.read_timeout = None;
    kube::Client::try_from(config).expect("a client")
}
