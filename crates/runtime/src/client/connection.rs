//! kubectl's connection flags (`--cluster`, `--user`, `--server`,
//! `--token`, `--as`, `--as-group`, `--insecure-skip-tls-verify`) put over
//! a loaded kubeconfig: what the admin tools take.

use anyhow::Context as _;

/// kubectl's connection flags over the kubeconfig: `--cluster`, `--user`,
/// `--server`, `--token`, `--as`, `--as-group`, `--insecure-skip-tls-verify`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionOverrides {
    pub cluster: Option<String>,
    pub user: Option<String>,
    pub server: Option<String>,
    pub token: Option<String>,
    pub impersonate: Option<String>,
    pub impersonate_groups: Vec<String>,
    pub insecure_skip_tls_verify: bool,
}

impl ConnectionOverrides {
    pub(super) fn names_kubeconfig_entries(&self) -> bool {
        self.cluster.is_some() || self.user.is_some()
    }

    /// Puts the overrides over a loaded configuration.
    pub fn apply(&self, config: &mut kube::Config) -> anyhow::Result<()> {
        if let Some(server) = &self.server {
            config.cluster_url = server
                .parse()
                .with_context(|| format!("--server={server:?} is not a URL"))?;
        }
        if let Some(token) = &self.token {
            // The token replaces whatever else the kubeconfig authenticates with.
            let auth: kube::config::AuthInfo =
                serde_json::from_value(serde_json::json!({ "token": token })).context("--token")?;
            config.auth_info.token = auth.token;
            config.auth_info.exec = None;
            config.auth_info.auth_provider = None;
            config.auth_info.username = None;
            config.auth_info.password = None;
        }
        if let Some(user) = &self.impersonate {
            config.auth_info.impersonate = Some(user.clone());
        }
        if !self.impersonate_groups.is_empty() {
            config.auth_info.impersonate_groups = Some(self.impersonate_groups.clone());
        }
        if self.insecure_skip_tls_verify {
            config.accept_invalid_certs = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_connection_flags_go_over_the_kubeconfig() {
        let mut config = kube::Config::new("https://kubeconfig:6443".parse().unwrap());
        ConnectionOverrides {
            server: Some("https://other:443".into()),
            token: Some("secret".into()),
            impersonate: Some("alice".into()),
            impersonate_groups: vec!["ops".into()],
            insecure_skip_tls_verify: true,
            ..ConnectionOverrides::default()
        }
        .apply(&mut config)
        .unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://other:443/");
        assert!(config.auth_info.token.is_some());
        assert_eq!(config.auth_info.impersonate.as_deref(), Some("alice"));
        assert_eq!(
            config.auth_info.impersonate_groups,
            Some(vec!["ops".to_string()])
        );
        assert!(config.accept_invalid_certs);
        let bad = ConnectionOverrides {
            server: Some("not a url".into()),
            ..ConnectionOverrides::default()
        }
        .apply(&mut config);
        assert!(bad.unwrap_err().to_string().contains("--server"));
    }
}
