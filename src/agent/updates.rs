//! What agent updates change, shared by the bridge's stdout reader and the run thread: the
//! reader handles each `session/update` as it arrives (traced, throttled activity and usage
//! reports to the state thread) without waking the run thread, which takes the same lock for
//! turns, permissions and the end of each call.

use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Sender;
use serde_json::Value;
use serde_json::value::RawValue;

use super::cost::Meter;
use crate::orchestrator::protocol::{Event, RunMsg};
use crate::trace::TraceSink;

/// How much of a turn's last message is kept for the rate-limit patterns (limit messages are
/// short; a long answer is work, and only its start is matched).
pub(super) const TURN_TEXT_MAX: usize = 4096;

/// Minimum spacing of activity reports to the state thread (traces get every update).
pub(super) const ACTIVITY_EVERY: Duration = Duration::from_millis(500);

pub(super) fn now_rfc3339() -> String {
    crate::time::format_time(SystemTime::now())
}

pub(super) fn last_chars(s: &str, n: usize) -> String {
    if n == 0 {
        return String::new();
    }
    let start = s
        .char_indices()
        .rev()
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i);
    s[start..].trim().to_string()
}

/// What the run takes from an agent update: its kind, a message chunk's text and a
/// `usage_update`'s tokens. Read without building a JSON tree; an update of another shape
/// (duplicate keys, odd types) is parsed whole, with the same outcome.
#[derive(serde::Deserialize, Default)]
pub(super) struct UpdateFacts<'a> {
    #[serde(rename = "sessionUpdate", borrow)]
    pub(super) kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) content: Option<ContentText<'a>>,
    pub(super) used: Option<u64>,
    /// A `usage_update`'s cost: the session's cumulative cost.
    #[serde(borrow)]
    pub(super) cost: Option<CostFacts<'a>>,
}

#[derive(serde::Deserialize)]
pub(super) struct CostFacts<'a> {
    pub(super) amount: Option<f64>,
    #[serde(borrow)]
    pub(super) currency: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
pub(super) struct ContentText<'a> {
    #[serde(borrow)]
    pub(super) text: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> UpdateFacts<'a> {
    pub(super) fn of(update: &'a RawValue) -> UpdateFacts<'a> {
        if let Ok(facts) = serde_json::from_str::<UpdateFacts>(update.get()) {
            return facts;
        }
        let Ok(value) = serde_json::from_str::<Value>(update.get()) else {
            return UpdateFacts::default();
        };
        let owned = |v: Option<&Value>| v.and_then(Value::as_str).map(|s| s.to_string().into());
        UpdateFacts {
            kind: owned(value.get("sessionUpdate")),
            content: Some(ContentText {
                text: owned(value.get("content").and_then(|c| c.get("text"))),
            }),
            used: value.get("used").and_then(Value::as_u64),
            cost: value.get("cost").map(|c| CostFacts {
                amount: c.get("amount").and_then(Value::as_f64),
                currency: owned(c.get("currency")),
            }),
        }
    }

    pub(super) fn text(&self) -> Option<&str> {
        self.content.as_ref()?.text.as_deref()
    }
}

/// What agent updates change. Shared by the bridge's stdout reader, which handles each
/// `session/update` as it arrives (without waking the run thread), and the run thread (turns,
/// permissions, the end of each call).
pub(super) struct Updates {
    pub(super) trace: TraceSink,
    pub(super) events: Sender<Event>,
    pub(super) run_id: String,
    pub(super) issue_id: String,
    pub(super) identifier: String,
    pub(super) session_id: String,
    pub(super) turn: u32,
    /// Tokens reported by `usage_update` during the current turn (fallback usage).
    pub(super) turn_context_tokens: Option<u64>,
    /// The run's token totals and cost, updated at each turn's end and with each cost the
    /// bridge reports.
    pub(super) meter: Meter,
    /// When the state thread was last told the run's usage; a bridge's cost and context
    /// reports are sent at most every [`ACTIVITY_EVERY`], one held back when its interval is
    /// up (the run thread wakes for it: `nudge`) or when the call ends (`flush`).
    pub(super) usage_sent_at: Option<Instant>,
    pub(super) usage_pending: bool,
    /// Wakes the run thread for a held-back report (usage or activity).
    pub(super) nudge: Sender<()>,
    /// An absurd figure from the bridge was said (once per run).
    pub(super) absurd_said: bool,
    pub(super) message: String,
    /// Updates of the current turn that are the agent's output (messages, thoughts, tool
    /// calls, plans): a turn with none was silent.
    pub(super) turn_output: u32,
    /// The current turn's last agent message (since its last tool call), bounded: what the
    /// kind's `rate_limit_patterns` are matched against.
    pub(super) turn_text: String,
    pub(super) last_activity_sent: Option<(Instant, String)>,
    /// The latest activity held back by the throttle (its kind, and whether the message
    /// changed); sent when a response arrives.
    pub(super) pending_activity: Option<(String, bool)>,
}

impl Updates {
    pub(super) fn send(&self, msg: RunMsg) {
        // The state thread outlives every run; a closed channel means it already exited.
        let _ = self.events.send(Event::Run {
            run_id: self.run_id.clone(),
            msg,
        });
    }

    /// Tells the state thread the run's token totals and cost (during a turn, with the
    /// turn's context size standing in for its input).
    pub(super) fn send_usage(&mut self, now: Instant) {
        self.usage_sent_at = Some(now);
        self.usage_pending = false;
        let usage = self.meter.usage_during_turn(self.turn_context_tokens);
        self.send(RunMsg::Usage(usage));
    }

    /// When a held-back usage report is due.
    pub(super) fn usage_due(&self) -> Option<Instant> {
        self.usage_pending
            .then(|| self.usage_sent_at.map(|at| at + ACTIVITY_EVERY))
            .flatten()
    }

    /// When a held-back activity report is due.
    pub(super) fn activity_due(&self) -> Option<Instant> {
        self.pending_activity
            .as_ref()
            .and(self.last_activity_sent.as_ref())
            .map(|(at, _)| *at + ACTIVITY_EVERY)
    }

    /// When the first held-back report is due.
    pub(super) fn due(&self) -> Option<Instant> {
        match (self.usage_due(), self.activity_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends the held-back reports that are due.
    pub(super) fn send_due(&mut self) {
        let now = Instant::now();
        if self.usage_due().is_some_and(|due| due <= now) {
            self.send_usage(now);
        }
        if self.activity_due().is_some_and(|due| due <= now)
            && let Some((event, message)) = self.pending_activity.take()
        {
            self.last_activity_sent = Some((now, event.clone()));
            let message = message.then(|| last_chars(&self.message, 300));
            self.send(RunMsg::Activity { event, message });
        }
    }

    /// A cost the bridge reported (`usage_update.cost`): whether it changed the run's.
    pub(super) fn on_cost(&mut self, cost: &CostFacts) -> bool {
        let (Some(amount), Some(currency)) = (cost.amount, cost.currency.as_deref()) else {
            return false;
        };
        if amount > crate::agent::cost::MAX_COST {
            self.absurd(&format!("a cost of {amount} {currency}"), "1e9");
        }
        self.meter.reported(amount, currency)
    }

    /// A token count as svc takes it: at most [`MAX_TOKENS`](crate::agent::cost::MAX_TOKENS).
    pub(super) fn bounded(&mut self, n: u64) -> u64 {
        let max = crate::agent::cost::MAX_TOKENS;
        if n > max {
            self.absurd(&format!("{n} tokens"), &max.to_string());
        }
        n.min(max)
    }

    /// Says once per run that the bridge reported something no session spends.
    pub(super) fn absurd(&mut self, what: &str, max: &str) {
        if std::mem::replace(&mut self.absurd_said, true) {
            return;
        }
        let message = format!(
            "the agent bridge reported {what}, more than any session spends: taken as {max} (said once per run)"
        );
        log::warn!("[{}] run {}: {message}", self.identifier, self.run_id);
        self.send(RunMsg::Notice {
            event: "usage_out_of_range".into(),
            message,
        });
    }

    /// The run's usage changed mid-turn (a new cost or context size): the state thread hears
    /// of it at once, or, within [`ACTIVITY_EVERY`] of the last report, when that interval is
    /// up (the run thread is woken for it) or the call ends, whichever comes first.
    pub(super) fn usage_changed(&mut self) {
        let now = Instant::now();
        match self.usage_sent_at {
            Some(at) if now.duration_since(at) < ACTIVITY_EVERY => {
                self.usage_pending = true;
                let _ = self.nudge.try_send(());
            }
            _ => self.send_usage(now),
        }
    }

    /// Traces one agent update, with the update's JSON text as the bridge sent it (this runs
    /// for every update an agent streams: no copy of it is built).
    pub(super) fn trace_update(&self, kind: &str, update: &RawValue) {
        #[derive(serde::Serialize)]
        struct UpdateLine<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            at: String,
            #[serde(rename = "runId")]
            run_id: &'a str,
            #[serde(rename = "issueId")]
            issue_id: &'a str,
            identifier: &'a str,
            #[serde(rename = "sessionId")]
            session_id: &'a str,
            turn: u32,
            update: &'a RawValue,
        }
        let line = UpdateLine {
            kind,
            at: now_rfc3339(),
            run_id: &self.run_id,
            issue_id: &self.issue_id,
            identifier: &self.identifier,
            session_id: &self.session_id,
            turn: self.turn,
            update,
        };
        self.trace.record(&self.issue_id, &line);
    }

    pub(super) fn on_update(&mut self, update: &RawValue) {
        let facts = UpdateFacts::of(update);
        let kind = facts.kind.as_deref().unwrap_or("unknown");
        self.trace_update(kind, update);
        let mut message = false;
        match kind {
            "agent_thought_chunk" | "plan" => self.turn_output += 1,
            "tool_call" | "tool_call_update" => {
                self.turn_output += 1;
                self.turn_text.clear();
            }
            _ => {}
        }
        match kind {
            "agent_message_chunk" => {
                self.turn_output += 1;
                if let Some(text) = facts.text() {
                    if self.turn_text.len() < TURN_TEXT_MAX {
                        let room = TURN_TEXT_MAX - self.turn_text.len();
                        let end = (0..=room.min(text.len()))
                            .rev()
                            .find(|i| text.is_char_boundary(*i))
                            .unwrap_or(0);
                        self.turn_text.push_str(&text[..end]);
                    }
                    if self
                        .last_activity_sent
                        .as_ref()
                        .is_some_and(|(_, k)| k != "agent_message_chunk")
                    {
                        self.message.clear();
                    }
                    self.message.push_str(text);
                    if self.message.len() > 4000 {
                        let cut = self.message.len() - 2000;
                        let cut = (cut..self.message.len())
                            .find(|i| self.message.is_char_boundary(*i))
                            .unwrap_or(0);
                        self.message.drain(..cut);
                    }
                    message = true;
                }
            }
            "usage_update" => {
                let mut changed = false;
                if let Some(used) = facts.used.map(|n| self.bounded(n))
                    && self.turn_context_tokens != Some(used)
                {
                    self.turn_context_tokens = Some(used);
                    changed = true;
                }
                if let Some(cost) = &facts.cost {
                    changed |= self.on_cost(cost);
                }
                if changed {
                    self.usage_changed();
                }
            }
            _ => {}
        }
        self.touch(kind, message);
    }

    /// Reports activity to the state thread, at most every [`ACTIVITY_EVERY`] for the same
    /// kind; `message`: the agent's message changed (its tail is cut only when it is sent).
    pub(super) fn touch(&mut self, kind: &str, message: bool) {
        let now = Instant::now();
        let due = match &self.last_activity_sent {
            Some((at, last)) => last != kind || now.duration_since(*at) >= ACTIVITY_EVERY,
            None => true,
        };
        if due {
            self.last_activity_sent = Some((now, kind.to_string()));
            self.pending_activity = None;
            self.send(RunMsg::Activity {
                event: kind.to_string(),
                message: message.then(|| last_chars(&self.message, 300)),
            });
        } else {
            // Held back; sent when its interval is up (the run thread is woken for it), with
            // the next report or when the call ends, with the newest message (a message seen
            // earlier in the held-back stretch counts).
            let _ = self.nudge.try_send(());
            let message = message || self.pending_activity.as_ref().is_some_and(|(_, m)| *m);
            match &mut self.pending_activity {
                Some((pending, m)) if pending == kind => *m = message,
                _ => self.pending_activity = Some((kind.to_string(), message)),
            }
        }
    }

    /// Sends the activity the throttle held back, so the snapshot ends a turn up to date.
    pub(super) fn flush(&mut self) {
        if let Some((event, message)) = self.pending_activity.take() {
            self.last_activity_sent = Some((Instant::now(), event.clone()));
            let message = message.then(|| last_chars(&self.message, 300));
            self.send(RunMsg::Activity { event, message });
        }
        if self.usage_pending {
            self.send_usage(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::last_chars;

    #[test]
    fn last_chars_keeps_the_tail_by_characters_and_trims_it() {
        assert_eq!(last_chars("  héllo wörld  ", 7), "wörld");
        assert_eq!(last_chars("ab", 300), "ab");
        assert_eq!(last_chars("日本語テキスト", 3), "キスト");
        assert_eq!(last_chars("abc", 0), "");
    }
}
