//! The oncely gateway (being built): the config file first.

pub mod config;
