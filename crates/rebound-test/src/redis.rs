//! A real `redis-server` on a free `127.0.0.1` port, for tests of the
//! shared host state: started with no persistence, killed when dropped,
//! and able to be killed, restarted and paused (SIGSTOP) mid-test.
//!
//! ```no_run
//! use rebound_test::redis::RedisServer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let server = RedisServer::start().await?;
//! assert!(server.url().starts_with("redis://127.0.0.1:"));
//! assert_eq!(server.command(&["PING"]).await?, "+PONG");
//!
//! // A slow Redis: the process stopped, then continued.
//! server.pause()?;
//! server.resume()?;
//! // Redis down, then back on the same port (its data gone).
//! server.kill().await;
//! server.restart().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The binary is `redis-server` on the `PATH` (or `REDIS_SERVER`); CI
//! installs the Debian package when it is missing. The server runs
//! `--save '' --appendonly no` (nothing written to disk) with its working
//! directory in the system temp dir. SIGSTOP / SIGCONT are sent with the
//! `kill` command (the workspace forbids `unsafe`, so no `libc`).
//!
//! Waits are bounded: [`start`](RedisServer::start) gives up after 10 s.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long [`RedisServer::start`] waits for the server to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` child process on `127.0.0.1`. See the
/// [module docs](self).
pub struct RedisServer {
    port: u16,
    child: Mutex<Option<Child>>,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("running", &self.pid().is_some())
            .finish()
    }
}

impl RedisServer {
    /// Start a server on a free port and wait until it answers `PING`.
    ///
    /// # Errors
    ///
    /// The binary is missing, or the server did not answer within 10 s.
    pub async fn start() -> io::Result<RedisServer> {
        let server = RedisServer {
            port: free_port()?,
            child: Mutex::new(None),
        };
        server.spawn().await?;
        Ok(server)
    }

    /// Whether a `redis-server` binary can be found (tests may skip
    /// without one; CI installs it).
    pub fn available() -> bool {
        Command::new(binary())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn spawn(&self) -> io::Result<()> {
        let child = Command::new(binary())
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        *self.lock() = Some(child);
        let started = tokio::time::Instant::now();
        loop {
            if let Ok(Ok(reply)) =
                tokio::time::timeout(Duration::from_millis(500), self.command(&["PING"])).await
            {
                if reply == "+PONG" {
                    return Ok(());
                }
            }
            if started.elapsed() > START_TIMEOUT {
                self.kill().await;
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "redis-server did not answer PING within 10 s",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Send one command (RESP array of bulk strings) on a new connection
    /// and return the first line of the reply, without its `\r\n`.
    ///
    /// # Errors
    ///
    /// The connection failed or closed before a full line.
    pub async fn command(&self, args: &[&str]) -> io::Result<String> {
        let mut conn = TcpStream::connect(self.addr()).await?;
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        conn.write_all(out.as_bytes()).await?;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            if conn.read(&mut byte).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            line.push(byte[0]);
            if line.len() > 64 * 1024 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "reply too long"));
            }
        }
        line.truncate(line.len() - 2);
        String::from_utf8(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Kill the server (SIGKILL) and wait for it to exit. Connections to it
    /// are reset; its data is gone.
    pub async fn kill(&self) {
        let child = self.lock().take();
        if let Some(mut child) = child {
            // A stopped process is killed too (SIGKILL needs no SIGCONT).
            let _ = child.kill();
            let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        }
    }

    /// Start the server again on the same port (after [`kill`](Self::kill)).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn restart(&self) -> io::Result<()> {
        self.kill().await;
        self.spawn().await
    }

    /// Stop the process (SIGSTOP): connections stay open, nothing answers.
    ///
    /// # Errors
    ///
    /// The server is not running, or `kill` failed.
    pub fn pause(&self) -> io::Result<()> {
        self.signal("-STOP")
    }

    /// Continue a paused process (SIGCONT).
    ///
    /// # Errors
    ///
    /// The server is not running, or `kill` failed.
    pub fn resume(&self) -> io::Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, sig: &str) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "redis-server not running"))?;
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("kill {sig} {pid} failed")))
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.lock().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A port the OS says is free now (bound, then released).
fn free_port() -> io::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_answers_pauses_and_restarts() {
        let server = RedisServer::start().await.expect("redis-server");
        assert_eq!(server.command(&["SET", "k", "v"]).await.unwrap(), "+OK");
        assert_eq!(server.command(&["GET", "k"]).await.unwrap(), "$1");

        server.pause().unwrap();
        let slow =
            tokio::time::timeout(Duration::from_millis(200), server.command(&["PING"])).await;
        assert!(slow.is_err(), "a stopped server does not answer");
        server.resume().unwrap();
        assert_eq!(server.command(&["PING"]).await.unwrap(), "+PONG");

        server.kill().await;
        assert!(server.command(&["PING"]).await.is_err());
        server.restart().await.unwrap();
        assert_eq!(server.command(&["GET", "k"]).await.unwrap(), "$-1");
    }
}
