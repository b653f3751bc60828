//! Fuzz target: `ferroce_fuzz::nic::run_calls` (its doc says what it checks).
#![cfg_attr(fuzzing, no_main)]

ferroce_fuzz::target!(ferroce_fuzz::nic::run_calls);
