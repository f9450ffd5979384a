//! `model-endpoint [--port N] COMMAND ANSWER`: the scripted model endpoint of the tests, on its
//! own, for trying a hosted CLI by hand: listens on 127.0.0.1 (port N, else one the kernel
//! gives), prints `port N` and serves until killed. Its model calls the CLI's shell tool with
//! COMMAND, then answers ANSWER and the command's output.

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let port = match args.first().map(String::as_str) {
        Some("--port") if args.len() > 1 => {
            let p = args[1].parse::<u16>().unwrap_or_else(|_| {
                eprintln!("model-endpoint: --port {:?}: not a port number", args[1]);
                std::process::exit(2);
            });
            args.drain(..2);
            p
        }
        _ => 0,
    };
    let [command, answer] = args.as_slice() else {
        eprintln!("model-endpoint: usage: model-endpoint [--port N] COMMAND ANSWER");
        std::process::exit(2);
    };
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| {
        eprintln!("model-endpoint: cannot listen on 127.0.0.1:{port}: {e}");
        std::process::exit(69);
    });
    let ep = tests::model_endpoint::Endpoint::on(listener, command, answer);
    println!("port {}", ep.port);
    loop {
        std::thread::park();
    }
}
