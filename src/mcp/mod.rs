//! The MCP endpoint svc serves to agents: JSON-RPC over Streamable HTTP (`POST /mcp`, in
//! `server`), bearer tokens (`auth`), tool packs and mounting (`tools`), and the read-only query
//! language every `*_query` tool shares (`query`).

pub mod auth;
pub mod query;
pub mod server;
pub mod tools;
