//! What a run costs, kept by the run as its usage arrives: the bridge's own figure when it
//! reports one (`usage_update.cost`, the session's cumulative cost), else the run's tokens at
//! the agent's prices (`agents.<kind>.pricing`). A figure in US dollars is the run's
//! `cost_usd`; one in another currency is kept as it came and counts in no USD sum.
//!
//! Nothing here allocates per update: the prices are a copy of the agent record's, and the
//! currency is stored again only when it changes.

use crate::config::{Pricing, UsageAccounting};
use crate::orchestrator::protocol::{OtherCost, Tokens, Usage, round_usd};

/// The most tokens one report may carry; more is taken as this many (a bridge's bug, such as an
/// unsigned underflow, must neither overflow a sum nor a database column).
pub const MAX_TOKENS: u64 = 1 << 40;
/// The most dollars (or other money) a session may report; more is taken as this much.
pub const MAX_COST: f64 = 1e9;

/// One turn's token report (a `session/prompt` result's `usage`, or the context size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnTokens {
    pub tokens: Tokens,
    /// Input tokens read from the prompt cache (`cachedReadTokens`), priced at
    /// `cached_input`; not part of `tokens.input`.
    pub cached_input: u64,
}

/// A run's usage and cost so far.
#[derive(Clone, Debug)]
pub struct Meter {
    pricing: Option<Pricing>,
    accounting: UsageAccounting,
    tokens: Tokens,
    /// Cache-read input tokens, accounted like `tokens`.
    cached_input: u64,
    /// The bridge's last cumulative cost: its amount and currency.
    reported: Option<(f64, String)>,
}

/// A cost in one currency, as the trace records it.
#[derive(Clone, Debug, PartialEq)]
pub struct Amount<'a> {
    pub amount: f64,
    pub currency: &'a str,
    /// `bridge` (the bridge reported it) or `prices` (tokens at the agent's prices).
    pub source: &'static str,
}

impl Meter {
    pub fn new(pricing: Option<Pricing>, accounting: UsageAccounting) -> Meter {
        Meter {
            pricing,
            accounting,
            tokens: Tokens::default(),
            cached_input: 0,
            reported: None,
        }
    }

    /// Takes a turn's token report: per-turn reports add up, cumulative ones replace.
    pub fn turn(&mut self, turn: TurnTokens) {
        match self.accounting {
            UsageAccounting::PerTurn => {
                self.tokens.add(turn.tokens);
                self.cached_input = self.cached_input.saturating_add(turn.cached_input);
            }
            UsageAccounting::Cumulative => {
                self.tokens = turn.tokens;
                self.cached_input = turn.cached_input;
            }
        }
    }

    /// Takes the session's cumulative cost as the bridge reported it. Returns whether it
    /// changed what the run cost. A negative or non-finite amount is ignored.
    pub fn reported(&mut self, amount: f64, currency: &str) -> bool {
        if amount.is_nan() || amount < 0.0 {
            return false;
        }
        let amount = amount.min(MAX_COST);
        match &mut self.reported {
            Some((a, c)) if c.as_str() == currency => {
                let changed = *a != amount;
                *a = amount;
                changed
            }
            slot => {
                *slot = Some((amount, currency.to_string()));
                true
            }
        }
    }

    pub fn tokens(&self) -> Tokens {
        self.tokens
    }

    /// What the run cost so far, in one currency, and where the figure came from.
    pub fn cost(&self) -> Option<Amount<'_>> {
        self.cost_of(self.tokens, self.cached_input)
    }

    /// [`Meter::cost`] as if the run had used `tokens` (`cached_input` of them from the cache).
    fn cost_of(&self, tokens: Tokens, cached_input: u64) -> Option<Amount<'_>> {
        match &self.reported {
            Some((amount, currency)) => Some(Amount {
                amount: *amount,
                currency: if is_usd(currency) { "USD" } else { currency },
                source: "bridge",
            }),
            None => self.pricing.map(|p| Amount {
                amount: p.cost_usd(tokens.input, cached_input, tokens.output),
                currency: "USD",
                source: "prices",
            }),
        }
    }

    /// What the state thread is told: the token totals and the cost.
    pub fn usage(&self) -> Usage {
        self.usage_during_turn(None)
    }

    /// What the state thread is told while a turn runs whose `usage_update`s reported
    /// `context` tokens in the session's context: a lower bound of what the turn spent, added
    /// to the total (and priced as input) until the turn's answer says what it used, so that
    /// budgets hold mid-turn. The input and output counts stay the answers' own.
    pub fn usage_during_turn(&self, context: Option<u64>) -> Usage {
        let mut tokens = self.tokens;
        let mut priced = tokens;
        if let Some(used) = context {
            match self.accounting {
                UsageAccounting::PerTurn => {
                    tokens.total = tokens.total.saturating_add(used);
                    priced.input = priced.input.saturating_add(used);
                }
                UsageAccounting::Cumulative => {
                    tokens.total = tokens.total.max(used);
                    priced.input = priced.input.max(used);
                }
            }
        }
        let cost = self.cost_of(priced, self.cached_input);
        Usage {
            tokens,
            cost_usd: cost
                .as_ref()
                .filter(|c| c.currency == "USD")
                .map(|c| c.amount),
            cost_other: cost.filter(|c| c.currency != "USD").map(|c| OtherCost {
                amount: c.amount,
                currency: c.currency.to_string(),
            }),
        }
    }
}

fn is_usd(currency: &str) -> bool {
    currency.eq_ignore_ascii_case("USD")
}

/// The cost of one turn as the trace records it: what the run's cost grew by since `before`,
/// with the run's cost so far (`run`), amounts to 6 decimal places.
pub fn turn_cost_json(before: Option<(f64, &str)>, after: Option<&Amount>) -> serde_json::Value {
    let Some(after) = after else {
        return serde_json::Value::Null;
    };
    let since = before
        .filter(|(_, currency)| *currency == after.currency)
        .map_or(0.0, |(amount, _)| amount);
    serde_json::json!({
        "amount": round_usd((after.amount - since).max(0.0)),
        "currency": after.currency,
        "run": round_usd(after.amount),
        "source": after.source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRICES: Pricing = Pricing {
        input: 3.0,
        output: 15.0,
        cached_input: 0.3,
    };

    fn turn(input: u64, cached_input: u64, output: u64) -> TurnTokens {
        TurnTokens {
            tokens: Tokens {
                input,
                output,
                total: input + cached_input + output,
            },
            cached_input,
        }
    }

    fn usd(m: &Meter) -> f64 {
        round_usd(m.usage().cost_usd.expect("a cost in USD"))
    }

    #[test]
    fn per_turn_reports_are_priced_per_turn_and_summed() {
        let mut m = Meter::new(Some(PRICES), UsageAccounting::PerTurn);
        assert_eq!(
            m.usage().cost_usd,
            Some(0.0),
            "a priced run starts at nothing"
        );
        // 1,000 input, 2,000 cached, 200 output: 0.003 + 0.0006 + 0.003.
        m.turn(turn(1000, 2000, 200));
        assert_eq!(usd(&m), 0.0066);
        let first = m.cost().map(|c| c.amount).unwrap();
        m.turn(turn(500, 0, 100));
        // The second turn: 0.0015 + 0.0015.
        assert_eq!(usd(&m), 0.0096);
        let traced = turn_cost_json(Some((first, "USD")), m.cost().as_ref());
        assert_eq!(
            traced,
            serde_json::json!({"amount": 0.003, "currency": "USD", "run": 0.0096, "source": "prices"})
        );
        assert_eq!(m.usage().tokens.total, 3800);
    }

    #[test]
    fn a_turns_context_counts_as_its_input_until_the_turn_ends() {
        let mut m = Meter::new(Some(PRICES), UsageAccounting::PerTurn);
        m.turn(turn(1000, 0, 200));
        let during = m.usage_during_turn(Some(5000));
        assert_eq!(during.tokens.input, 1000, "the answers' own");
        assert_eq!(during.tokens.total, 6200);
        // 6,000 input and 200 output at $3 and $15 a million.
        assert_eq!(round_usd(during.cost_usd.unwrap()), 0.021);
        assert_eq!(m.usage(), m.usage_during_turn(None));
        let mut c = Meter::new(None, UsageAccounting::Cumulative);
        c.turn(turn(1000, 0, 200));
        assert_eq!(c.usage_during_turn(Some(800)).tokens.total, 1200);
        assert_eq!(c.usage_during_turn(Some(5000)).tokens.total, 5000);
        assert_eq!(c.usage_during_turn(Some(5000)).cost_usd, None);
    }

    #[test]
    fn cumulative_reports_replace_and_are_priced_once() {
        let mut m = Meter::new(Some(PRICES), UsageAccounting::Cumulative);
        m.turn(turn(1000, 0, 200));
        assert_eq!(usd(&m), 0.006);
        m.turn(turn(1500, 0, 300));
        assert_eq!(usd(&m), 0.009, "the run's totals, not their sum");
        assert_eq!(m.tokens().input, 1500);
    }

    #[test]
    fn a_cost_the_bridge_reports_in_usd_wins_over_the_prices() {
        let mut m = Meter::new(Some(PRICES), UsageAccounting::PerTurn);
        m.turn(turn(1000, 0, 200));
        assert!(m.reported(0.25, "USD"));
        assert!(!m.reported(0.25, "USD"), "the same figure changes nothing");
        m.turn(turn(1000, 0, 200));
        assert_eq!(usd(&m), 0.25);
        assert!(m.reported(0.5, "usd"));
        let u = m.usage();
        assert_eq!((u.cost_usd, u.cost_other), (Some(0.5), None));
        assert_eq!(m.cost().unwrap().source, "bridge");
        // Cumulative: the latest figure is the run's, whatever came before.
        assert!(!m.reported(-1.0, "USD"));
        assert!(!m.reported(f64::NAN, "USD"));
        assert_eq!(m.usage().cost_usd, Some(0.5));
    }

    #[test]
    fn a_cost_in_another_currency_is_kept_as_such_and_has_no_usd_figure() {
        let mut m = Meter::new(Some(PRICES), UsageAccounting::PerTurn);
        m.turn(turn(1000, 0, 200));
        assert!(m.reported(1.25, "EUR"));
        let u = m.usage();
        assert_eq!(u.cost_usd, None);
        assert_eq!(
            u.cost_other,
            Some(OtherCost {
                amount: 1.25,
                currency: "EUR".into()
            })
        );
        assert_eq!(
            turn_cost_json(None, m.cost().as_ref()),
            serde_json::json!({"amount": 1.25, "currency": "EUR", "run": 1.25, "source": "bridge"})
        );
    }

    #[test]
    fn no_price_and_no_reported_cost_is_no_cost() {
        let mut m = Meter::new(None, UsageAccounting::PerTurn);
        m.turn(turn(1000, 0, 200));
        assert_eq!(m.usage().cost_usd, None);
        assert_eq!(m.usage().cost_other, None);
        assert!(m.cost().is_none());
        assert_eq!(turn_cost_json(None, None), serde_json::Value::Null);
    }
}
