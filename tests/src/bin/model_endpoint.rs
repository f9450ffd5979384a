//! `model-endpoint COMMAND ANSWER`: the scripted model endpoint of the tests, on its own, for
//! trying a hosted CLI by hand: prints `port N` and serves until killed. Its model calls the
//! CLI's shell tool with COMMAND, then answers ANSWER and the command's output.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [command, answer] = args.as_slice() else {
        eprintln!("model-endpoint: usage: model-endpoint COMMAND ANSWER");
        std::process::exit(2);
    };
    let ep = tests::model_endpoint::Endpoint::start(command, answer);
    println!("port {}", ep.port);
    loop {
        std::thread::park();
    }
}
