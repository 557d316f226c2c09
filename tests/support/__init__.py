"""Helpers shared by the test tiers (no tests here).

- `loop`: specs, scripted policies and store readers for the agent-loop tests;
- `adversarial`: contracts, judge payloads and the honesty oracle of the adversarial tier;
- `probe`: the status probe's setup (a round that hangs until released, heartbeats
  counted, the answers read back);
- `tickets`: an in-memory ticket tracker whose tool can be compensated;
- `cli`: driving the `tether` command in a subprocess (e2e, chaos, reliability...);
- `fake_provider`: OpenAI- and Anthropic-shaped model providers on 127.0.0.1;
- `fault_proxy`: a byte-level proxy that resets, stalls or trickles a connection;
- `procs`: waiting on and reaping child processes;
- `services`: the ticket API and the notice receiver of `tests/services/` as child
  processes;
- `workers`: `tether worker` processes on one database;
- `stall_tools`: `create_ticket` with a short tether timeout, for the proxy faults.

A helper one test file uses stays in that file; once a second file needs it, it moves
here rather than being imported from a test module or copied.
"""
