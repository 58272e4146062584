//! The kubeconfig the server writes for itself, so that kubectl, kube-rs and `tenure elect` find it
//! the way they find any cluster.

/// A kubeconfig with one cluster, context and (credential-less) user named `tenure`, pointing at
/// `url`, with `namespace` as the context's default namespace.
pub fn render(url: &str, namespace: &str) -> String {
    format!(
        "# Written by tenure apiserver: an in-memory Kubernetes API server without authentication.\n\
         apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: tenure\n  cluster:\n    server: {url}\n\
         contexts:\n\
         - name: tenure\n  context:\n    cluster: tenure\n    user: tenure\n    namespace: {namespace}\n\
         current-context: tenure\n\
         users:\n\
         - name: tenure\n  user: {{}}\n\
         preferences: {{}}\n"
    )
}
