"""Dev tooling: embedded servers, the dev IMAP server, sinks, sample mails, the system harness.

Used by ``mailroom dev``, the tests and the benchmarks. No product module imports this
package (an import-linter contract checks it); it needs the project's dev dependencies.
"""
