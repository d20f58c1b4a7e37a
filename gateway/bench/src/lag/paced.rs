//! One phase of writes at a fixed rate, open loop, with probes that time
//! how long each sampled write takes to show in the index.

use super::*;

/// Writes at `rate` cells/s for `duration`, open loop with at most
/// `in_flight` writes under way, sampling `probes` writes a second; then
/// waits for the drain and the probes.
pub(super) async fn paced(
    run: &Arc<Run>,
    label: String,
    rate: f64,
    duration: Duration,
    in_flight: usize,
    probes: u32,
) -> anyhow::Result<Phase> {
    run.caught_up().await?;
    let batch = run.data.batch as f64;
    let every = Duration::from_secs_f64(batch / rate.max(1e-3));
    let sample_every = Duration::from_secs_f64(1.0 / f64::from(probes.max(1)));
    let writes = Arc::new(Semaphore::new(in_flight.max(1)));
    let probing = Arc::new(Semaphore::new(MAX_PROBES));
    let latency = Arc::new(Mutex::new(histogram()));
    let lag = Arc::new(Mutex::new(histogram()));
    let unseen = Arc::new(AtomicU64::new(0));
    let last_ack = Arc::new(Mutex::new(None::<Instant>));

    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let before = run.acked.load(Ordering::Relaxed);
    let sampler = {
        let run = run.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE_EVERY, SAMPLE_EVERY);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                // The acknowledged count is read before the scrape, so a
                // write acknowledged meanwhile never shows as a backlog.
                let acked = run.acked.load(Ordering::Relaxed);
                if let Ok((applied, pending, lag_ms)) = run.figures().await {
                    samples.push((
                        started.elapsed().as_secs_f64(),
                        acked as i64 - applied as i64,
                        pending,
                        lag_ms,
                    ));
                }
            }
            samples
        })
    };

    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let deadline = started + duration;
    let mut next_sample = started;
    let mut sampled = 0u64;
    let mut writers = Vec::new();
    let mut probe_tasks = Vec::new();
    while Instant::now() < deadline {
        tick.tick().await;
        let permit = writes.clone().acquire_owned().await?;
        let probe = if Instant::now() >= next_sample {
            next_sample += sample_every;
            probing.clone().try_acquire_owned().ok()
        } else {
            None
        };
        sampled += u64::from(probe.is_some());
        let (run, latency, lag, unseen, last_ack) = (
            run.clone(),
            latency.clone(),
            lag.clone(),
            unseen.clone(),
            last_ack.clone(),
        );
        let (probe_tx, probe_rx) = tokio::sync::oneshot::channel();
        writers.push(tokio::spawn(async move {
            let driver = probe.as_ref().map(|_| Uuid::new_v4());
            let sent = Instant::now();
            let result = run.write(driver).await;
            drop(permit);
            latency
                .lock()
                .expect("latency")
                .saturating_record(sent.elapsed().as_micros() as u64);
            match result {
                Ok((row_key, acked)) => {
                    let mut last = last_ack.lock().expect("last ack");
                    *last = Some(last.map_or(acked, |l| l.max(acked)));
                    drop(last);
                    if let (Some(driver), Some(permit)) = (driver, probe) {
                        let _ = probe_tx.send(tokio::spawn(async move {
                            match run.probe(driver, row_key, acked).await {
                                Some(delay) => lag
                                    .lock()
                                    .expect("lag")
                                    .saturating_record(delay.as_micros() as u64),
                                None => {
                                    unseen.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            drop(permit);
                        }));
                    }
                }
                Err(message) => run.failed(message),
            }
        }));
        probe_tasks.push(probe_rx);
    }
    for writer in writers {
        writer.await?;
    }
    let written = run.acked.load(Ordering::Relaxed) - before;
    let last = last_ack
        .lock()
        .expect("last ack")
        .unwrap_or_else(Instant::now);
    let achieved = written as f64 / (last - started).as_secs_f64().max(1e-9);
    run.caught_up().await?;
    let drain = last.elapsed();
    for probe in probe_tasks {
        if let Ok(task) = probe.await {
            task.await?;
        }
    }
    let _ = stop.send(true);
    let samples = sampler.await?;
    let latency = latency.lock().expect("latency").clone();
    let lag = lag.lock().expect("lag").clone();
    Ok(Phase {
        label,
        target: rate,
        achieved,
        write_p50_ms: latency.value_at_quantile(0.5) as f64 / 1000.0,
        write_p99_ms: latency.value_at_quantile(0.99) as f64 / 1000.0,
        sampled,
        lag,
        unseen: unseen.load(Ordering::Relaxed),
        samples,
        drain,
    })
}
