//! Agent runs: the ACP client (`acp`), bridge launch and provider overlays (`launch`), the run
//! thread and its turn loop (`run`), and what agent updates change (`updates`).

pub mod acp;
pub mod cost;
pub mod launch;
pub mod limit;
pub mod pipes;
pub mod run;
mod updates;
