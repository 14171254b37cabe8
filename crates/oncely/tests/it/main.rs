//! Integration tests of the `oncely` binary: the real executable, real SQLite files, real
//! HTTP and HTTPS servers on 127.0.0.1 port 0.

mod admin;
mod audit;
mod chaos;
mod check_config;
mod cli;
mod cluster;
mod common;
mod console;
mod console_browser;
mod console_hostile;
mod contract;
mod demo;
mod deploy;
mod docs;
mod durable;
mod e2e;
mod faults;
mod hostile;
mod http_toolkit;
mod inventory;
mod jobs;
mod mcp;
mod mcp_numbers;
mod openapi;
mod packaging;
mod process;
mod proxy;
mod reconcile;
mod reload;
mod retries;
mod secrets;
mod statements;
mod traces;
mod webhook_numbers;
mod webhooks;
