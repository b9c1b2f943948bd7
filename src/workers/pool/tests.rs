//! The pool's rules with a fake clock: no sleeps, every driver answer fed in by hand.

use super::*;

fn limits() -> Limits {
    Limits {
        max: 2,
        warm: 0,
        ..Limits::spec_defaults()
    }
}

fn record(id: &str) -> WorkerRecord {
    WorkerRecord {
        worker_id: id.into(),
        worker_host: Some(format!("fake://worker-{id}")),
        driver_ref: None,
        created_at_ms: 0,
        labels: BTreeMap::new(),
        metadata: serde_json::Value::Null,
    }
}

/// A pool and its clock; `settle` answers every driver call in order, successfully (as a
/// healthy driver would) except probes of the machines in `failing_probes`.
struct World {
    pool: Pool,
    now: Millis,
    /// Every effect seen, in order.
    log: Vec<Effect>,
    failing_probes: BTreeSet<WorkerId>,
}

impl World {
    fn new(limits: Limits) -> World {
        World {
            pool: Pool::new(limits, Spend::default(), 1_000_000),
            now: 1_000_000,
            log: Vec::new(),
            failing_probes: BTreeSet::new(),
        }
    }

    fn feed(&mut self, input: Input) -> Vec<Effect> {
        let fx = handle(&mut self.pool, self.now, input);
        self.log.extend(fx.iter().cloned());
        fx
    }

    /// Feeds `input`, then answers provisions, probes and destroys with success until quiet.
    fn settle(&mut self, input: Input) -> Vec<Effect> {
        let mut all = Vec::new();
        let mut queue = VecDeque::from([input]);
        while let Some(input) = queue.pop_front() {
            for e in self.feed(input) {
                match &e {
                    Effect::Provision { worker, .. } => queue.push_back(Input::Provisioned {
                        worker: worker.clone(),
                        result: Ok(record(worker)),
                    }),
                    Effect::Probe { worker, .. } => queue.push_back(Input::Probed {
                        worker: worker.clone(),
                        result: if self.failing_probes.contains(worker) {
                            Err("unreachable".into())
                        } else {
                            Ok(())
                        },
                    }),
                    Effect::Destroy { worker, .. } => queue.push_back(Input::Destroyed {
                        worker: worker.clone(),
                        result: Ok(()),
                    }),
                    _ => {}
                }
                all.push(e);
            }
        }
        all
    }

    fn advance(&mut self, ms: Millis) -> Vec<Effect> {
        self.now += ms;
        self.settle(Input::Tick)
    }

    fn acquire(&mut self, lease: LeaseId, issue: &str) -> Vec<Effect> {
        self.settle(Input::Acquire {
            lease,
            issue_id: issue.into(),
            affinity: None,
        })
    }
}

fn grants(fx: &[Effect]) -> Vec<(LeaseId, WorkerId)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Grant { lease, worker, .. } => Some((*lease, worker.clone())),
            _ => None,
        })
        .collect()
}

fn denials(fx: &[Effect]) -> Vec<(LeaseId, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Deny { lease, reason } => Some((*lease, reason.clone())),
            _ => None,
        })
        .collect()
}

fn destroyed(fx: &[Effect]) -> Vec<(WorkerId, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Destroy { worker, reason, .. } => Some((worker.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

fn provisions(fx: &[Effect]) -> usize {
    fx.iter()
        .filter(|e| matches!(e, Effect::Provision { .. }))
        .count()
}

fn status(w: &World) -> Status {
    w.pool.status()
}

#[test]
fn warm_machines_are_ready_before_the_first_run_and_handed_out_after_a_probe() {
    let mut w = World::new(Limits {
        min: 1,
        warm: 1,
        ..limits()
    });
    let fx = w.settle(Input::Tick);
    assert_eq!(provisions(&fx), 1, "{fx:?}");
    assert_eq!(status(&w).idle, 1);
    let fx = w.feed(Input::Acquire {
        lease: 1,
        issue_id: "i-1".into(),
        affinity: None,
    });
    // Probed before it is handed out; the grant waits for the probe. The warm machine is
    // promised, so the next one is warmed at once (max 2).
    assert!(
        matches!(&fx[0], Effect::Probe { worker, .. } if worker == "w-1"),
        "{fx:?}"
    );
    assert!(grants(&fx).is_empty());
    assert_eq!(provisions(&fx), 1, "{fx:?}");
    let fx = w.settle(Input::Probed {
        worker: "w-1".into(),
        result: Ok(()),
    });
    assert_eq!(grants(&fx), [(1, "w-1".to_string())]);
    w.settle(Input::Provisioned {
        worker: "w-2".into(),
        result: Ok(record("w-2")),
    });
    assert_eq!(status(&w).leased, 1);
    assert_eq!(status(&w).idle, 1);
}

#[test]
fn the_pool_grows_on_demand_up_to_max_and_times_acquires_out() {
    let mut w = World::new(limits());
    assert_eq!(grants(&w.acquire(1, "i-1")), [(1, "w-1".to_string())]);
    assert_eq!(grants(&w.acquire(2, "i-2")), [(2, "w-2".to_string())]);
    // At max: the third waits...
    let fx = w.acquire(3, "i-3");
    assert!(grants(&fx).is_empty() && provisions(&fx) == 0, "{fx:?}");
    assert_eq!(status(&w).waiting, 1);
    assert_eq!(status(&w).slots, Some(2));
    // ... and gets the first machine released within the timeout.
    let fx = w.settle(Input::Release { lease: 1 });
    assert_eq!(grants(&fx), [(3, "w-1".to_string())]);
    // A fourth waits past acquire_timeout_ms and is denied.
    w.acquire(4, "i-4");
    assert!(denials(&w.advance(29_999)).is_empty());
    let fx = w.advance(1);
    let denied = denials(&fx);
    assert_eq!(denied.len(), 1);
    assert!(
        denied[0].1.contains("acquire_timeout_ms (30000 ms)"),
        "{denied:?}"
    );
    assert_eq!(status(&w).waiting, 0);
}

#[test]
fn a_failing_provision_backs_off_and_its_error_reaches_the_denial() {
    let mut w = World::new(limits());
    let fx = w.feed(Input::Acquire {
        lease: 1,
        issue_id: "i-1".into(),
        affinity: None,
    });
    assert_eq!(provisions(&fx), 1);
    let fx = w.feed(Input::Provisioned {
        worker: "w-1".into(),
        result: Err("quota exceeded".into()),
    });
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Event {
            event: "worker_pool_provision_failed",
            ..
        }
    )));
    // No retry before the backoff (1 s), one after it.
    w.now += 999;
    assert_eq!(provisions(&w.feed(Input::Tick)), 0);
    w.now += 1;
    let fx = w.feed(Input::Tick);
    assert_eq!(provisions(&fx), 1);
    w.feed(Input::Provisioned {
        worker: "w-2".into(),
        result: Err("quota exceeded".into()),
    });
    w.now += 30_000;
    let fx = w.feed(Input::Tick);
    let denied = denials(&fx);
    assert!(
        denied[0].1.contains("last provision error: quota exceeded"),
        "{denied:?}"
    );
}

#[test]
fn a_failed_probe_retires_the_machine_and_the_run_gets_another() {
    let mut w = World::new(Limits {
        warm: 1,
        ..limits()
    });
    w.settle(Input::Tick);
    w.failing_probes.insert("w-1".into());
    let fx = w.acquire(1, "i-1");
    assert_eq!(destroyed(&fx)[0].0, "w-1", "{fx:?}");
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Event {
            event: "worker_pool_probe_failed",
            ..
        }
    )));
    assert_eq!(grants(&fx), [(1, "w-2".to_string())]);
}

#[test]
fn reaping_by_ttl_idleness_and_stale_heartbeat_never_takes_a_leased_machine() {
    let mut w = World::new(Limits {
        max: 3,
        min: 1,
        warm: 1,
        ttl_ms: 100_000,
        idle_reap_ms: 20_000,
        ..limits()
    });
    w.acquire(1, "i-1");
    w.acquire(2, "i-2");
    // Three machines: two leased (w-1, w-2), w-3 warm.
    assert_eq!(status(&w).live, 3);
    w.settle(Input::Release { lease: 2 });
    // Idle beyond warm, above min, past idle_reap_ms: w-2 or w-3 goes, one stays warm.
    let fx = w.advance(30_000);
    assert_eq!(destroyed(&fx).len(), 1, "{fx:?}");
    assert!(destroyed(&fx)[0].1.contains("idle_reap_ms"));
    assert_eq!(status(&w).live, 2);
    // Past the ttl: the idle one is destroyed at once (and replaced); the leased one only
    // when released.
    let fx = w.advance(75_000);
    let gone: Vec<String> = destroyed(&fx).into_iter().map(|(id, _)| id).collect();
    assert!(!gone.contains(&"w-1".to_string()), "{gone:?}");
    assert!(
        w.pool.machines["w-1"]
            .retired
            .as_deref()
            .unwrap()
            .contains("ttl")
    );
    let fx = w.settle(Input::Release { lease: 1 });
    assert_eq!(destroyed(&fx)[0].0, "w-1");
    // A stale heartbeat (probes that never answer) retires a machine too.
    let mut w = World::new(Limits {
        warm: 1,
        stale_heartbeat_ms: 40_000,
        ..limits()
    });
    w.settle(Input::Tick);
    w.now += 15_000;
    let fx = w.feed(Input::Tick);
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Probe { .. })),
        "heartbeat probe"
    );
    // The probe never answers; by the next reaps the heartbeat is stale.
    w.now += 15_000;
    w.feed(Input::Tick);
    w.now += 15_000;
    let fx = w.feed(Input::Tick);
    assert!(
        destroyed(&fx)
            .iter()
            .any(|(id, why)| id == "w-1" && why.contains("stale")),
        "{fx:?}"
    );
}

#[test]
fn drain_waits_for_leases_until_the_deadline_then_destroys_everything() {
    let mut w = World::new(Limits {
        warm: 1,
        ..limits()
    });
    w.acquire(1, "i-1");
    w.acquire(2, "i-2");
    w.feed(Input::Acquire {
        lease: 3,
        issue_id: "i-3".into(),
        affinity: None,
    });
    let fx = w.settle(Input::Drain);
    assert_eq!(denials(&fx).len(), 1, "the waiting acquire is denied");
    assert!(destroyed(&fx).is_empty(), "leased machines wait");
    let fx = w.settle(Input::Release { lease: 1 });
    assert_eq!(destroyed(&fx)[0].0, "w-1");
    assert!(!fx.contains(&Effect::Drained));
    // w-2 is still leased at the deadline: destroyed anyway.
    let fx = w.advance(30_000);
    assert_eq!(destroyed(&fx)[0].0, "w-2");
    assert!(fx.contains(&Effect::Drained), "{fx:?}");
    assert!(w.pool.machines.is_empty());
    // Nothing new is acquired while draining.
    let fx = w.acquire(9, "i-9");
    assert!(denials(&fx)[0].1.contains("draining"));
}

#[test]
fn spend_caps_block_new_work_but_never_running_work() {
    // Lifetime cap: 100 worker-seconds.
    let mut w = World::new(Limits {
        max_worker_seconds: Some(100),
        ..limits()
    });
    w.acquire(1, "i-1");
    let fx = w.advance(99_000);
    assert!(w.pool.capped().is_none(), "{fx:?}");
    let fx = w.advance(1_000);
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Event {
            event: "worker_pool_spend_capped",
            ..
        }
    )));
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::SaveSpend(s) if s.lifetime_ms == 100_000))
    );
    assert!(
        destroyed(&fx).is_empty(),
        "the leased machine keeps running"
    );
    let fx = w.acquire(2, "i-2");
    assert!(
        denials(&fx)[0]
            .1
            .contains("spend.max_worker_seconds reached"),
        "{fx:?}"
    );
    assert_eq!(status(&w).slots, Some(1), "dispatch sees no room");
    // Released: the idle machine only costs, so it goes.
    let fx = w.settle(Input::Release { lease: 1 });
    assert_eq!(destroyed(&fx).len(), 1);

    // max_concurrent_workers limits growth below max.
    let mut w = World::new(Limits {
        max: 5,
        max_concurrent_workers: Some(1),
        ..limits()
    });
    w.acquire(1, "i-1");
    let fx = w.acquire(2, "i-2");
    assert_eq!(provisions(&fx), 0);
    assert_eq!(status(&w).slots, Some(1));
}

#[test]
fn the_daily_cap_rolls_over_at_utc_midnight_and_survives_a_restart() {
    let day = 20_000;
    let mut w = World::new(Limits {
        daily_worker_seconds: Some(3600),
        ..limits()
    });
    // 22:00 UTC; yesterday's figure in the file does not count today.
    w.now = day * DAY_MS + 22 * 3_600_000;
    let yesterday = Spend {
        lifetime_ms: 5000,
        day: day - 1,
        day_ms: 9_999_000,
    };
    w.pool = Pool::new(w.pool.limits.clone(), yesterday, w.now);
    assert_eq!((w.pool.spend.day, w.pool.spend.day_ms), (day, 0));
    w.acquire(1, "i-1");
    // One machine for an hour: today's 3600 worker-seconds are used at 23:00.
    let fx = w.advance(3_600_000);
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::Event {
                event: "worker_pool_spend_capped",
                ..
            }
        )),
        "{fx:?}"
    );
    assert!(
        denials(&w.acquire(2, "i-2"))[0]
            .1
            .contains("spend.daily_worker_seconds")
    );
    // A restart in between reads the day's figure back from the spend file: still capped.
    let mut restarted = Pool::new(w.pool.limits.clone(), w.pool.spend, w.now);
    let fx = handle(&mut restarted, w.now, Input::Tick);
    assert!(restarted.capped().is_some(), "{fx:?}");
    // One second past midnight the new day has used one second: the cap lifts.
    let fx = w.advance(3_601_000);
    assert_eq!((w.pool.spend.day, w.pool.spend.day_ms), (day + 1, 1000));
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::Event {
                event: "worker_pool_spend_uncapped",
                ..
            }
        )),
        "{fx:?}"
    );
    assert_eq!(w.pool.spend.lifetime_ms, 5000 + 7_201_000);
}

#[test]
fn max_workers_per_issue_and_affinity() {
    let mut w = World::new(Limits {
        max: 3,
        max_in_flight: 2,
        max_workers_per_issue: Some(1),
        ..limits()
    });
    // Two runs of one issue share its one machine (two slots).
    assert_eq!(grants(&w.acquire(1, "i-1")), [(1, "w-1".to_string())]);
    assert_eq!(grants(&w.acquire(2, "i-1")), [(2, "w-1".to_string())]);
    // A third of the same issue may not take a second machine: it waits.
    let fx = w.acquire(3, "i-1");
    assert!(grants(&fx).is_empty() && provisions(&fx) == 0, "{fx:?}");
    w.settle(Input::Cancel { lease: 3 });
    // Another issue gets its own machine.
    assert_eq!(grants(&w.acquire(4, "i-2")), [(4, "w-2".to_string())]);
    // A retry re-lands on its previous machine when that has room.
    w.settle(Input::Release { lease: 1 });
    w.settle(Input::Release { lease: 2 });
    w.settle(Input::Release { lease: 4 });
    let fx = w.settle(Input::Acquire {
        lease: 5,
        issue_id: "i-2".into(),
        affinity: Some("w-2".into()),
    });
    assert_eq!(grants(&fx), [(5, "w-2".to_string())]);
}

#[test]
fn adoption_probes_survivors_and_destroys_those_over_max() {
    let mut w = World::new(Limits { max: 1, ..limits() });
    let fx = w.feed(Input::Adopt {
        records: vec![record("w-4"), record("w-7")],
    });
    assert_eq!(
        destroyed(&fx),
        [(
            "w-7".to_string(),
            "adopted beyond worker_pool.max".to_string()
        )]
    );
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Probe { worker, .. } if worker == "w-4"))
    );
    // New machines never reuse an adopted id.
    w.settle(Input::Probed {
        worker: "w-4".into(),
        result: Ok(()),
    });
    assert_eq!(grants(&w.acquire(1, "i-1")), [(1, "w-4".to_string())]);
    assert_eq!(w.pool.next_worker, 7);
}

#[test]
fn a_new_driver_generation_retires_the_old_machines_without_dropping_leases() {
    let mut w = World::new(limits());
    w.acquire(1, "i-1");
    let fx = w.settle(Input::NewGeneration(1));
    assert!(destroyed(&fx).is_empty(), "the leased machine stays");
    let fx = w.settle(Input::Release { lease: 1 });
    assert_eq!(destroyed(&fx)[0].0, "w-1");
    let fx = w.acquire(2, "i-2");
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Provision { generation: 1, .. }))
    );
}

/// A replaced driver's busy machine does not count against the new driver's `max`: the next
/// request gets a machine of the new generation at once, while the old one keeps its run.
#[test]
fn a_replaced_drivers_busy_machine_leaves_the_new_driver_its_capacity() {
    let mut w = World::new(Limits { max: 1, ..limits() });
    assert_eq!(grants(&w.acquire(1, "i-1")).len(), 1);
    w.settle(Input::NewGeneration(1));
    let fx = w.acquire(2, "i-2");
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Provision { generation: 1, .. })),
        "{fx:?}"
    );
    assert_eq!(grants(&fx), [(2, "w-2".to_string())]);
    assert!(destroyed(&fx).is_empty(), "the old machine keeps its run");
    assert_eq!(status(&w).live, 2);
    // The spend cap counts every machine, the retired driver's too.
    let mut w = World::new(Limits {
        max: 1,
        max_concurrent_workers: Some(1),
        ..limits()
    });
    w.acquire(1, "i-1");
    w.settle(Input::NewGeneration(1));
    assert!(grants(&w.acquire(2, "i-2")).is_empty());
    assert_eq!(
        grants(&w.settle(Input::Release { lease: 1 })),
        [(2, "w-2".to_string())]
    );
}

#[test]
fn the_local_machine_has_unlimited_slots() {
    let mut w = World::new(Limits::unbounded_local());
    w.settle(Input::Tick);
    for lease in 1..=50 {
        assert_eq!(grants(&w.acquire(lease, &format!("i-{lease}"))).len(), 1);
    }
    assert_eq!(status(&w).live, 1);
    assert_eq!(status(&w).slots, None);
}
