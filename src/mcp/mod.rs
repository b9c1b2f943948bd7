//! The MCP endpoint svc serves to agents: JSON-RPC over Streamable HTTP (`POST /mcp`, in
//! `server`), bearer tokens (`auth`), tool packs (`tools`, `github`, `gitlab`, and the chat packs `chat_a`
//! and `chat_b` over what they share in `chat`), the registry that mounts them (`packs`), the
//! read-only query language every `*_query` tool shares (`query`), and per-run claims for remote
//! agents (`claims`, Token B), served on the loopback `server.mcp_port` listener.

pub mod auth;
pub mod chat;
pub mod chat_a;
pub mod chat_b;
pub mod github;
pub mod gitlab;
pub mod packs;
pub mod query;
pub mod run_tokens;
pub mod server;
pub mod tools;
