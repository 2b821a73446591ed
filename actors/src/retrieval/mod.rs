//! Retrieval: the search root fans a query out to every shard of a KB (leaf searches), merges
//! each channel across shards by its own score, then fuses the channels (distribution-based
//! score fusion by default, or weighted RRF).

pub mod fusion;
pub mod root;

pub use fusion::{Channel, ChannelHitInfo, FusedHit, FusionMethod, dbsf_fuse, rrf_fuse};
pub use root::{RootSearch, SearchHit, SearchRequest, SearchResponse, SearchTimings};
