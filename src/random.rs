//! Random tokens: 32 bytes from the operating system's source, URL-safe base64 without padding.
//! A leaf: the MCP tokens, the control token and steering messages' keys all come from here.

use base64::Engine;

/// A fresh random token (43 characters).
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
