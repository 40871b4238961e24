//! `tierkit kv ...` subcommands (owned by the kv-elastic work; placeholder until it lands).
