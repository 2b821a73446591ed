//! Metadata consensus on Raft (tikv raft-rs 0.7).
//!
//! - [`storage`]: [`SledRaftStorage`], the Raft log, hard state, membership and snapshots in
//!   sled, implementing `raft::Storage`.
//! - [`state_machine`]: [`RaftStateMachine`], what committed entries are applied to (the
//!   metadata store) and how its whole state moves as a snapshot.
//! - [`driver`]: [`RaftNode`], a `RawNode` on its own named thread fed by a channel:
//!   proposals, peer messages, ticks, conf changes and read-index requests.
//! - [`replicated`]: [`ReplicatedMeta`], the metadata door of a clustered node: proposals
//!   from any node (followers forward to the leader), ReadIndex barriers for fresh reads.
//! - [`network`]: the [`Transport`] trait the driver sends messages through, and an in-memory
//!   network for tests that can partition, drop and kill nodes.

pub mod driver;
pub mod logger;
pub mod network;
pub mod replicated;
pub mod state_machine;
pub mod storage;

pub use driver::{ClusterStatus, PeerStatus, RaftConfig, RaftHandle, RaftNode};
pub use network::Transport;
pub use replicated::ReplicatedMeta;
pub use state_machine::{Proposal, RaftStateMachine};
pub use storage::{PeerAddress, SledRaftStorage};
