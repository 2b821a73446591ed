//! Retrieval: the search root fans a query out to every shard of a KB (leaf searches), merges
//! each channel across shards by its own score, then fuses the channels (distribution-based
//! score fusion by default, or weighted RRF).

pub mod fusion;
pub mod graph;
pub mod leaf;
pub mod links;
pub mod mmr;
pub mod packing;
pub mod query;
pub mod rescore;
pub mod rewrite;
pub mod root;
pub mod settings;
pub mod text;

pub use fusion::{Channel, ChannelHitInfo, FusedHit, FusionMethod, dbsf_fuse, rrf_fuse};
pub use graph::GraphQuery;
pub use root::{
    HitPath, Pipeline, RootSearch, SearchHit, SearchRequest, SearchResponse, SearchTimings,
};
/// The rerank clients live in `sift-models`; re-exported where the search pipeline uses them.
pub use sift_models::rerank;
pub use sift_models::rerank::{RerankApi, RerankServiceConfig, RerankServices};
