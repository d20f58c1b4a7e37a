//! End-to-end tests of `cellgate serve`: each test starts the real binary on
//! a free port against a fresh database and talks GraphQL over HTTP to it,
//! checking the contract in `schema/schema.graphql`. Every test runs on
//! SQLite, and on MariaDB/MySQL and PostgreSQL when
//! `CELLGATE_TEST_MYSQL_URL` / `CELLGATE_TEST_POSTGRES_URL` are set (see
//! `harness.rs`).

mod cells;
mod errors;
mod harness;
mod ids;
mod indexes;
mod meta;
mod online;
mod reload;

e2e_suite!(
    cells::put_cells_reports_written_duplicate_and_conflict,
    cells::latest_cell_history_and_versions,
    cells::int64_accepts_numbers_and_strings_exactly,
    cells::rows_in_order_and_cell_log_pages,
    cells::compressible_and_deep_bodies_read_back,
    cells::floats_read_back_to_the_last_bit,
    cells::direct_writes_equal_the_executors,
    indexes::every_operator_on_every_type_where_and_filter_agree,
    indexes::projection_returns_only_selected_fields,
    indexes::pagination_has_no_gaps_or_repeats,
    indexes::index_entries_fetch_their_rows,
    indexes::direct_answers_equal_the_executors,
    errors::invalid_inputs_are_coded_errors,
    errors::query_errors_have_stable_codes,
    meta::datastores_describe_definitions_and_topology,
    meta::demo_server_answers_the_readme_query,
    meta::a_default_innodb_buffer_pool_is_warned_about,
    ids::ids_over_graphql_and_leaf_routes,
    ids::two_gateways_on_one_data_directory_issue_no_duplicate,
    reload::reload_swaps_definitions_while_serving,
    reload::watch_reloads_changed_definitions,
    reload::a_planned_reload_applies_what_was_planned_only,
    online::a_changed_index_keeps_answering_on_two_gateways,
);
