//! `zonal exporter`: Prometheus `/metrics` for every published handle of the user.
//!
//! Each scrape asks every handle in the directory for its exposition (`vmstat prometheus`),
//! adds `pid` and `handle` labels to its samples and merges the handles' families, so that
//! each metric has one `# HELP`/`# TYPE` and all its samples together, as the text format
//! requires. `zonal_up{pid,handle}` says which handles answered; the handles are asked all at
//! once under one deadline, so a scrape answers within the timeout whatever they do, and a
//! handle that does not answer (stopped, wedged) is reported down, never an error.

use std::path::Path;
use std::time::Duration;
use zonal::live;

/// How long a scrape waits for the handles unless `--timeout` says otherwise.
pub const HANDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// One metric family: its help and type lines and its samples.
#[derive(Default)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

/// Families in the order first seen.
#[derive(Default)]
struct Families {
    order: Vec<String>,
    by_name: std::collections::HashMap<String, Family>,
}

impl Families {
    fn get(&mut self, name: &str) -> &mut Family {
        if !self.by_name.contains_key(name) {
            self.order.push(name.to_string());
        }
        self.by_name.entry(name.to_string()).or_default()
    }

    /// Adds one handle's exposition, with `labels` (`pid="1",handle="2"`) on every sample.
    fn add(&mut self, text: &str, labels: &str) {
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split_whitespace().next().unwrap_or_default();
                self.get(name).help.get_or_insert_with(|| line.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split_whitespace().next().unwrap_or_default();
                self.get(name).kind.get_or_insert_with(|| line.to_string());
            } else if !line.starts_with('#') {
                let name_end = line.find(['{', ' ']).unwrap_or(line.len());
                let name = &line[..name_end];
                let sample = match line[name_end..].strip_prefix('{') {
                    Some(rest) => format!("{name}{{{labels},{rest}"),
                    None => format!("{name}{{{labels}}}{}", &line[name_end..]),
                };
                self.get(name).samples.push(sample);
            }
        }
    }

    fn render(&self) -> String {
        let mut s = String::new();
        for name in &self.order {
            let f = &self.by_name[name];
            for l in f.help.iter().chain(&f.kind).chain(&f.samples) {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }
}

/// The body of one scrape of `dir`.
pub fn scrape(dir: &Path, timeout: Duration) -> String {
    let mut fams = Families::default();
    // A directory refused (someone else's, a link, open to others) is said on every scrape,
    // on stderr and in the body, and read as holding nothing.
    let (handles, refused) = match live::list(dir) {
        Ok(h) => (h, None),
        Err(e) => {
            eprintln!("zonal exporter: {e}");
            (Vec::new(), Some(e.to_string()))
        }
    };
    // Every handle at once under one deadline: the scrape answers within the timeout
    // whatever the handles do, a stopped one included.
    let answers = live::request_all(&handles, "vmstat prometheus", timeout);
    let mut up = Vec::new();
    for (p, answer) in handles.iter().zip(answers) {
        // The pid is the kernel's word for the server (SO_PEERCRED), not the socket's name.
        let labels = format!("pid=\"{}\",handle=\"{}\"", p.pid, p.handle);
        match answer {
            Ok(text) => {
                fams.add(&text, &labels);
                up.push(format!("zonal_up{{{labels}}} 1"));
            }
            Err(_) => up.push(format!("zonal_up{{{labels}}} 0")),
        }
    }
    let mut s =
        String::from("# HELP zonal_up Whether the published handle answered this scrape.\n# TYPE zonal_up gauge\n");
    for l in &up {
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(&format!(
        "# HELP zonal_exporter_handles Published handles found in the directory.\n# TYPE zonal_exporter_handles gauge\n\
         zonal_exporter_handles {}\n",
        handles.len()
    ));
    if let Some(e) = refused {
        s.push_str(&format!("# zonal exporter: {}\n", e.replace('\n', " ")));
    }
    s + &fams.render()
}

/// The address `--listen` names, in the forms Prometheus exporters take
/// (`--web.listen-address`): `HOST:PORT` (a name, an IPv4 address or a bracketed IPv6 one),
/// `:PORT` for every interface, and a bare `PORT` as the same.
pub fn listen_addr(listen: &str) -> Result<String, String> {
    let s = listen.trim();
    let port_only = s.strip_prefix(':').unwrap_or(s);
    if !port_only.is_empty() && port_only.bytes().all(|b| b.is_ascii_digit()) {
        let port: u16 = port_only.parse().map_err(|_| format!("--listen `{listen}`: the port must be 0 to 65535"))?;
        return Ok(format!("0.0.0.0:{port}"));
    }
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(s.to_string()),
        _ => Err(format!(
            "--listen `{listen}`: give HOST:PORT (127.0.0.1:9835, [::1]:9835, localhost:9835), :PORT or PORT \
             (every interface)"
        )),
    }
}

/// Serves `/metrics` on `listen` until the process is stopped; prints the address it bound
/// (a port of 0 picks a free one) as the first line on stdout.
pub fn run(listen: &str, dir: &Path, timeout: Duration) -> Result<(), String> {
    let listen = &listen_addr(listen)?;
    // A directory that is there but refused is an error at once, not a silent empty scrape.
    live::list(dir).map_err(|e| e.to_string())?;
    let server = tiny_http::Server::http(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = server.server_addr().to_ip().map(|a| a.to_string()).unwrap_or_else(|| listen.to_string());
    println!("zonal exporter: serving http://{addr}/metrics for the handles published in {}", dir.display());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    for req in server.incoming_requests() {
        let text_header = |ct: &str| tiny_http::Header::from_bytes("Content-Type", ct).expect("a valid header");
        let path = req.url().split('?').next().unwrap_or("").to_string();
        let method = req.method().clone();
        let resp = match (&method, path.as_str()) {
            (tiny_http::Method::Get | tiny_http::Method::Head, "/metrics") => {
                tiny_http::Response::from_string(scrape(dir, timeout))
                    .with_header(text_header("text/plain; version=0.0.4; charset=utf-8"))
            }
            (tiny_http::Method::Get | tiny_http::Method::Head, "/") => tiny_http::Response::from_string(
                "zonal exporter: the metrics of every published zonal handle are at /metrics\n",
            )
            .with_header(text_header("text/plain; charset=utf-8")),
            (tiny_http::Method::Get | tiny_http::Method::Head, _) => {
                tiny_http::Response::from_string("not found: try /metrics\n").with_status_code(404)
            }
            _ => tiny_http::Response::from_string("method not allowed\n").with_status_code(405),
        };
        // A client that left before its answer is its own loss.
        let _ = req.respond(resp);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_merge_across_handles_with_labels() {
        let a = "# HELP m_a A.\n# TYPE m_a gauge\nm_a 1\n# HELP m_b B.\n# TYPE m_b gauge\nm_b{node=\"0\"} 2\n";
        let mut f = Families::default();
        f.add(a, "pid=\"1\",handle=\"1\"");
        f.add(a, "pid=\"2\",handle=\"1\"");
        let out = f.render();
        assert_eq!(out.matches("# TYPE m_a gauge").count(), 1, "{out}");
        assert!(out.contains("m_a{pid=\"1\",handle=\"1\"} 1\nm_a{pid=\"2\",handle=\"1\"} 1\n"), "{out}");
        assert!(out.contains("m_b{pid=\"2\",handle=\"1\",node=\"0\"} 2"), "{out}");
        // Every family's samples follow its TYPE line, before the next family.
        let b_type = out.find("# TYPE m_b").unwrap();
        assert!(out.rfind("m_a{").unwrap() < b_type);
    }

    #[test]
    fn listen_takes_the_forms_prometheus_exporters_take() {
        assert_eq!(listen_addr(":9837").unwrap(), "0.0.0.0:9837");
        assert_eq!(listen_addr("9837").unwrap(), "0.0.0.0:9837");
        assert_eq!(listen_addr("127.0.0.1:9835").unwrap(), "127.0.0.1:9835");
        assert_eq!(listen_addr("[::1]:0").unwrap(), "[::1]:0");
        assert_eq!(listen_addr("localhost:9835").unwrap(), "localhost:9835");
        for bad in ["", ":", "99999", ":70000", "host", "host:", ":port", "1.2.3.4:99999"] {
            let e = listen_addr(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
    }
}
