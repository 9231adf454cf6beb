//! The synthetic workload the report commands can run first (`--workload`), so that a reader
//! sees the counters and free lists move: allocate N blocks of random orders under a policy,
//! then free a share of them at random, leaving the rest allocated (and the buddy lists
//! fragmented) when the report is printed.

use zonal::{Gfp, MemPolicy, Zonal};

/// The most allocations one workload makes: enough to fill any fake topology many times.
const MAX_ALLOCS: usize = 100_000_000;

/// A parsed `--workload` spec: `allocs=N,orders=A-B,policy=P,free=PCT,seed=S`.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub allocs: usize,
    pub orders: (u32, u32),
    pub policy: String,
    pub free_percent: u32,
    pub seed: u64,
}

impl Workload {
    pub fn parse(s: &str) -> Result<Workload, String> {
        let mut w = Workload { allocs: 1000, orders: (0, 0), policy: "local".into(), free_percent: 50, seed: 1 };
        // Items are `,`-separated; a fragment without `=` continues the value before it,
        // so `policy=bind=0,1` keeps its node list.
        let mut items: Vec<(String, String)> = Vec::new();
        for frag in s.split(',').map(str::trim).filter(|f| !f.is_empty()) {
            match frag.split_once('=') {
                Some((k, v)) if ["allocs", "orders", "policy", "free", "seed"].contains(&k.trim()) => {
                    items.push((k.trim().to_string(), v.trim().to_string()))
                }
                _ => match items.last_mut() {
                    Some((k, v)) if k == "policy" => {
                        v.push(',');
                        v.push_str(frag);
                    }
                    _ => {
                        return Err(format!(
                            "workload: `{frag}` is not one of allocs=N, orders=A-B, policy=P, free=PCT, seed=S"
                        ))
                    }
                },
            }
        }
        for (i, (k, _)) in items.iter().enumerate() {
            if items[..i].iter().any(|(j, _)| j == k) {
                return Err(format!("workload: `{k}` is given twice"));
            }
        }
        for (k, v) in items {
            let num = |v: &str| v.parse::<u64>().map_err(|_| format!("workload `{k}`: `{v}` is not a number"));
            let small = |v: &str| v.parse::<u32>().map_err(|_| format!("workload `{k}`: `{v}` is not a small number"));
            match k.as_str() {
                "allocs" => {
                    w.allocs = num(&v)?
                        .try_into()
                        .ok()
                        .filter(|&n| n <= MAX_ALLOCS)
                        .ok_or_else(|| format!("workload `allocs`: {v} is more than {MAX_ALLOCS}"))?;
                }
                "orders" => {
                    let (a, b) = v.split_once('-').unwrap_or((&v, &v));
                    let (a, b) = (small(a)?, small(b)?);
                    if a > b {
                        return Err(format!("workload `orders`: range `{v}` runs backwards"));
                    }
                    w.orders = (a, b);
                }
                "policy" => w.policy = v,
                "free" => {
                    w.free_percent = small(&v)?;
                    if w.free_percent > 100 {
                        return Err(format!("workload `free`: {v} is not a percentage"));
                    }
                }
                "seed" => w.seed = num(&v)?,
                _ => return Err(format!("workload: unknown key `{k}`")),
            }
        }
        Ok(w)
    }

    /// Runs the workload; returns (blocks allocated, blocks freed, allocations that failed
    /// for lack of memory). Blocks not freed stay allocated in `z`.
    pub fn run(&self, z: &Zonal) -> Result<(usize, usize, usize), String> {
        let policy = MemPolicy::parse(&self.policy, z.topology().nr_nodes()).map_err(|e| e.to_string())?;
        if self.orders.1 > z.max_order().get() as u32 {
            return Err(format!("workload `orders`: {} is above max_order {}", self.orders.1, z.max_order().get()));
        }
        z.set_thread_policy(policy).map_err(|e| e.to_string())?;
        let mut rng = self.seed.max(1);
        let mut next = move || {
            // xorshift64: deterministic and good enough to pick orders and victims.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let span = (self.orders.1 - self.orders.0 + 1) as u64;
        let mut live = Vec::new();
        let mut failed = 0;
        for _ in 0..self.allocs {
            let order = self.orders.0 + (next() % span) as u32;
            match z.alloc_pages(Gfp::KERNEL, order) {
                Ok(p) => live.push((p, order)),
                Err(zonal::Error::OutOfMemory { .. }) => failed += 1,
                Err(e) => return Err(e.to_string()),
            }
        }
        let allocated = live.len();
        let mut freed = 0;
        for (p, order) in live {
            if next() % 100 < self.free_percent as u64 {
                z.free_pages(p.as_ptr(), order).map_err(|e| e.to_string())?;
                freed += 1;
            }
        }
        z.set_thread_policy(MemPolicy::Local).map_err(|e| e.to_string())?;
        Ok((allocated, freed, failed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let w = Workload::parse("allocs=10,orders=0-3,policy=bind=0,1,free=25").unwrap();
        assert_eq!(w.allocs, 10);
        assert_eq!(w.orders, (0, 3));
        assert_eq!(w.policy, "bind=0,1");
        assert_eq!(w.free_percent, 25);
        assert!(Workload::parse("allocs=x").unwrap_err().contains("not a number"));
        assert!(Workload::parse("colour=red").unwrap_err().contains("is not one of"));
        assert!(Workload::parse("orders=3-1").unwrap_err().contains("backwards"));
        assert!(Workload::parse("free=150").unwrap_err().contains("percentage"));
        assert!(Workload::parse("allocs=1,allocs=2").unwrap_err().contains("`allocs` is given twice"));
    }
}
