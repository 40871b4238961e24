//! `tierkit`: the command line of the tierkit workspace (replay, fit, synthesize, simulate, plot).
fn main() {
    println!("tierkit: no commands yet");
}
