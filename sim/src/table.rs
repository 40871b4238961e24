//! Plain text tables on stdout (comfy-table, no terminal styling so output pipes cleanly).

use comfy_table::{presets::ASCII_MARKDOWN, CellAlignment, Table};

/// Renders a table with a header row; columns after the first are right-aligned (numbers).
/// The preset is Markdown-compatible, so output can be pasted into docs as is.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = Table::new();
    t.load_preset(ASCII_MARKDOWN);
    t.set_header(header.iter().copied());
    for r in rows {
        t.add_row(r.iter().cloned());
    }
    for i in 1..header.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t.to_string()
}
