//! `orderly-client ledger`: what is new is verified onto what was kept, and a server whose
//! history changed (an entry rewritten, the newest ones lost, two that traded places, three
//! reordered) is a divergence at the first seq that differs, exit 3, nothing kept. Each change
//! is planted in a backup of the server, restored into another (its entries chained again when
//! it opens, as a history rewritten by its operator would be), which the client then reads
//! with what it kept.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::cli::{Cli, Ran};
use crate::server::{basket, Partner, Server};

/// A server whose partner has a credit and `orders` orders (1 + `orders` entries), and the
/// client that verified them.
fn verified(orders: usize) -> (Server, Partner, Cli, tempfile::TempDir) {
    let server = Server::start(&[]);
    let partner = server.partner(100_000, 0);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&server.url, &partner.api_key, dir.path());
    for i in 0..orders {
        assert_eq!(cli.place(&format!("o{i}"), &basket("p", 1)).code, 0);
    }
    let ran = ledger(&cli, &partner);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.line()["seq"], orders as u64 + 1);
    (server, partner, cli, dir)
}

fn ledger(cli: &Cli, partner: &Partner) -> Ran {
    cli.run(&["ledger", "--account", &partner.account_id])
}

/// The divergence a run reported: its first seq.
fn diverged_at(ran: &Ran) -> u64 {
    assert_eq!(ran.code, 3, "{:?} {}", ran.lines, ran.stderr);
    ran.line()["divergence"]["firstSeq"].as_u64().unwrap()
}

/// `backup` with `account`'s ledger lines (oldest first) changed by `change`, its balance set
/// to where they end, their chain taken off (chained again when the restored store opens),
/// and its digest made right.
fn changed(backup: &str, account: &str, change: impl FnOnce(&mut Vec<Value>)) -> String {
    let mut lines: Vec<Value> = backup
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let end = lines.pop().unwrap();
    let is_entry = |l: &Value| l["kind"] == "ledger" && l["account"] == account;
    let first = lines.iter().position(is_entry).unwrap();
    let count = lines.iter().filter(|l| is_entry(l)).count();
    let mut entries: Vec<Value> = lines.drain(first..first + count).collect();
    change(&mut entries);
    let mut running = 0i64;
    for entry in &mut entries {
        running += entry["entry"]["amount"].as_i64().unwrap();
        entry["entry"]["balance_after"] = json!(running);
        let fields = entry.as_object_mut().unwrap();
        fields.remove("seq");
        fields.remove("hash");
    }
    lines.splice(first..first, entries);
    for line in &mut lines {
        if line["kind"] == "account" && line["account"]["id"] == account {
            line["balance"] = json!(running);
        }
    }
    let mut body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let digest: String = Sha256::digest(body.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut end = end;
    end["sha256"] = json!(digest);
    let counts = &mut end["counts"];
    counts["ledger"] = json!(lines.iter().filter(|l| l["kind"] == "ledger").count());
    body.push_str(&format!("{end}\n"));
    body
}

#[test]
fn the_ledger_command_verifies_what_is_new_and_keeps_it() {
    let (server, partner, cli, _dir) = verified(2);
    let again = ledger(&cli, &partner);
    assert_eq!(again.line()["newEntries"], 0);
    assert_eq!(again.line()["seq"], 3);

    assert_eq!(cli.place("o9", &basket("p", 1)).code, 0);
    let ran = ledger(&cli, &partner);

    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.line()["newEntries"], 1);
    assert_eq!(ran.line()["seq"], 4);
    assert_eq!(ran.line()["available"], server.balance(&partner.api_key));
    let (_, balance) = server.get(&partner.api_key, "/b2b/balance");
    assert_eq!(ran.line()["hash"], balance["ledgerHead"]["hash"]);
}

#[test]
fn an_entry_rewritten_is_a_divergence_at_its_seq() {
    let (server, partner, cli, _dir) = verified(3);
    let backup = changed(&server.backup(), &partner.account_id, |entries| {
        entries[1]["entry"]["reference"] = json!("ord_rewritten");
    });
    let rewritten = Server::restored(&backup);

    let ran = ledger(&cli.via(&rewritten.url), &partner);

    assert_eq!(diverged_at(&ran), 2);
    let kept = ledger(&cli, &partner);
    assert_eq!(kept.line()["newEntries"], 0, "the divergence kept nothing");
}

#[test]
fn entries_lost_by_a_rewind_are_a_divergence_at_the_first_lost_seq_even_with_new_ones_after() {
    let (server, partner, cli, _dir) = verified(4);
    let backup = changed(&server.backup(), &partner.account_id, |entries| {
        entries.truncate(3);
    });
    let rewound = Server::restored(&backup);
    let on_rewound = cli.via(&rewound.url);

    assert_eq!(diverged_at(&ledger(&on_rewound, &partner)), 4);
    // The history that remains goes on: new entries take the lost seqs, and the divergence
    // is still where the histories part.
    for i in 0..3 {
        let placed = on_rewound.place(&format!("after-{i}"), &basket("q", 1));
        assert_eq!(placed.code, 0, "{:?}", placed.lines);
    }
    assert_eq!(diverged_at(&ledger(&on_rewound, &partner)), 4);
}

#[test]
fn two_entries_that_traded_places_are_a_divergence_at_the_first_of_them() {
    let (server, partner, cli, _dir) = verified(3);
    let backup = changed(&server.backup(), &partner.account_id, |entries| {
        let (a, b) = (entries[2]["entry"].clone(), entries[3]["entry"].clone());
        for (to, from) in [(2, &b), (3, &a)] {
            for field in ["amount", "reason", "reference"] {
                entries[to]["entry"][field] = from[field].clone();
            }
        }
    });
    let swapped = Server::restored(&backup);

    assert_eq!(diverged_at(&ledger(&cli.via(&swapped.url), &partner)), 3);
}

#[test]
fn entries_put_in_another_order_are_a_divergence_at_the_first_that_moved() {
    let (server, partner, cli, _dir) = verified(4);
    let backup = changed(&server.backup(), &partner.account_id, |entries| {
        // The credit stays first; the four charges are taken in another order (by their
        // references, the orders they belong to).
        let references: Vec<Value> = entries
            .iter()
            .map(|e| e["entry"]["reference"].clone())
            .collect();
        for (to, from) in [(2, 3), (3, 4), (4, 2)] {
            entries[to]["entry"]["reference"] = references[from].clone();
        }
    });
    let reordered = Server::restored(&backup);

    assert_eq!(diverged_at(&ledger(&cli.via(&reordered.url), &partner)), 3);
}

#[test]
fn from_start_verifies_every_entry_again_against_what_was_kept() {
    let (server, partner, cli, _dir) = verified(2);
    let ran = cli.run(&["ledger", "--account", &partner.account_id, "--from-start"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.line()["newEntries"], 0);
    assert_eq!(ran.line()["seq"], 3);
    // And against another history, from the start too.
    let backup = changed(&server.backup(), &partner.account_id, |entries| {
        entries[2]["entry"]["reference"] = json!("ord_other");
    });
    let other = Server::restored(&backup);
    let ran =
        cli.via(&other.url)
            .run(&["ledger", "--account", &partner.account_id, "--from-start"]);
    assert_eq!(diverged_at(&ran), 3);
}
