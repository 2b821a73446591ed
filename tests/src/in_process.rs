//! A node inside the test process.

use std::path::Path;

use sift_node::config::Config;
use sift_node::server::RunningNode;

use crate::{ApiClient, require_model};

/// A node started with [`sift_node::server::start`] on port 0. Call
/// [`InProcessNode::shutdown`] to stop it; otherwise it stops with the test's runtime.
pub struct InProcessNode {
    pub url: String,
    running: RunningNode,
}

impl InProcessNode {
    /// A node on [`Config::for_test`] (fault injection on) with the embedded model.
    pub async fn start(data_dir: &Path) -> InProcessNode {
        let mut config = Config::for_test(data_dir);
        config.embedding.model_dir = Some(require_model());
        let node = InProcessNode::start_with(config).await;
        let embedders = &node.running.node.context().embedders;
        assert!(
            embedders.local.is_some(),
            "the in-process node has no embedded model: {:?}",
            embedders.local_error
        );
        node
    }

    /// A node on `config` as given (it may run without the embedded model).
    pub async fn start_with(config: Config) -> InProcessNode {
        let running = sift_node::server::start(config)
            .await
            .unwrap_or_else(|error| panic!("starting an in-process node: {error:#}"));
        InProcessNode {
            url: running.url(),
            running,
        }
    }

    pub fn client(&self) -> ApiClient {
        ApiClient::new(&self.url)
    }

    pub fn running(&self) -> &RunningNode {
        &self.running
    }

    pub async fn shutdown(self) {
        self.running.shutdown().await;
    }
}
