//! A Rust program of ordinary allocation density (bench/run's `rust` row): records parsed
//! from text into owned strings, grouped in a `HashMap`, sorted, summarised into a
//! `BTreeMap` of boxed trait objects, and dropped batch by batch. Prints a checksum, so that
//! every configuration is checked to compute the same thing.
//!
//! Usage: rust_alloc BATCHES (each ~20k records, ~10 allocations per record).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

#[cfg(feature = "traced")]
#[global_allocator]
static ALLOC: mem_trace::Traced<std::alloc::System> = mem_trace::Traced::new(std::alloc::System);

trait Summary {
    fn score(&self) -> u64;
}

struct Totals {
    name: String,
    values: Vec<u64>,
}

impl Summary for Totals {
    fn score(&self) -> u64 {
        self.values.iter().sum::<u64>() + self.name.len() as u64
    }
}

struct Record {
    user: String,
    tags: Vec<String>,
    value: u64,
}

/// One line of the batch's input text.
fn line(batch: u64, i: u64, out: &mut String) {
    out.clear();
    let user = (i * 7919 + batch) % 3000;
    let _ = write!(out, "user{user};tag{},tag{};{}", i % 13, i % 17, i * 31 % 1000);
}

fn parse(text: &str) -> Record {
    let mut fields = text.split(';');
    let user = fields.next().unwrap_or_default().to_string();
    let tags = fields
        .next()
        .unwrap_or_default()
        .split(',')
        .map(str::to_owned)
        .collect();
    let value = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    Record { user, tags, value }
}

fn batch(n: u64, records: u64) -> u64 {
    let mut text = String::new();
    let mut groups: HashMap<String, Vec<Record>> = HashMap::new();
    for i in 0..records {
        line(n, i, &mut text);
        let r = parse(&text);
        groups.entry(r.user.clone()).or_default().push(r);
    }
    let mut summary: BTreeMap<String, Box<dyn Summary>> = BTreeMap::new();
    for (user, mut rs) in groups {
        rs.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.tags.cmp(&b.tags)));
        let values: Vec<u64> = rs.iter().map(|r| r.value).take(8).collect();
        let name = format!("{user}/{}", rs.len());
        summary.insert(user, Box::new(Totals { name, values }));
    }
    summary.values().map(|s| s.score()).fold(n, u64::wrapping_add)
}

fn main() {
    let batches: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let mut sum = 0u64;
    for n in 0..batches {
        sum = sum.wrapping_mul(31).wrapping_add(batch(n, 20_000));
    }
    println!("checksum {sum}");
}
