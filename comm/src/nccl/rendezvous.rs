//! A small TCP rendezvous, like torch's `MASTER_ADDR`/`MASTER_PORT`: rank 0 listens on
//! `addr:port`, every other rank connects (retrying until the timeout) and says who it is; once
//! all ranks have arrived, rank 0 sends each of them the 128-byte NCCL unique id and the host
//! name of every rank.
//!
//! The protocol is private to this crate (all ranks must run the same version of it): a peer
//! sends `MAGIC, rank, size, host name`; rank 0 answers `MAGIC, status` and then either the id
//! and the host list (status 0) or an error message (status 1). Rank 0 checks that every peer
//! agrees on the world size and that no rank arrives twice.

use crate::error::CommError;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: u64 = 0x4c53_4744_4e43_4c31; // "LSGDNCL1"
const RETRY: Duration = Duration::from_millis(100);
const MAX_HOST_LEN: usize = 1024;

/// Where and how long to meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpRendezvous {
    /// This rank, `0..size`.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// Rank 0's address as `host:port` (`[v6addr]:port` for IPv6).
    pub addr: String,
    /// How long rank 0 waits for everyone, and the others for rank 0.
    pub timeout: Duration,
}

/// What every rank knows after the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousOutcome {
    /// The NCCL unique id created by rank 0.
    pub id: [u8; 128],
    /// Host name of every rank, by rank.
    pub hosts: Vec<String>,
}

impl TcpRendezvous {
    /// Meet the other ranks. Rank 0 calls `make_id` once (only rank 0 does) to create the id it
    /// hands out; `host` is this rank's host name.
    ///
    /// Errors name the address, the port, the timeout and what went wrong: an address that does
    /// not parse or resolve, a port rank 0 cannot listen on, peers that did not arrive in time,
    /// a peer that disagrees about the world size or reuses a rank.
    pub fn run(
        &self,
        host: &str,
        make_id: impl FnOnce() -> Result<[u8; 128], CommError>,
    ) -> Result<RendezvousOutcome, CommError> {
        if self.size == 0 || self.rank >= self.size {
            return Err(CommError::InvalidConfig(format!(
                "rank {} is not valid for a world of {} rank(s) (valid ranks: 0..{})",
                self.rank, self.size, self.size
            )));
        }
        if self.timeout.is_zero() {
            return Err(CommError::InvalidConfig(
                "the rendezvous timeout must be positive (got 0s)".into(),
            ));
        }
        if host.len() > MAX_HOST_LEN {
            return Err(CommError::InvalidConfig(format!(
                "host name longer than {MAX_HOST_LEN} bytes"
            )));
        }
        let addrs = self.resolve()?;
        if self.size == 1 {
            // Nobody to meet: no socket at all.
            return Ok(RendezvousOutcome {
                id: make_id()?,
                hosts: vec![host.to_string()],
            });
        }
        if self.rank == 0 {
            self.serve(&addrs, host, make_id)
        } else {
            self.join(&addrs, host)
        }
    }

    fn err(&self, what: impl std::fmt::Display) -> CommError {
        CommError::Backend {
            backend: "nccl",
            message: format!(
                "TCP rendezvous at {} (rank {} of {}, timeout {:?}): {what}",
                self.addr, self.rank, self.size, self.timeout
            ),
        }
    }

    fn resolve(&self) -> Result<Vec<SocketAddr>, CommError> {
        let (host, port) = split_host_port(&self.addr)?;
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| {
                CommError::InvalidConfig(format!(
                    "rendezvous address {:?}: host {host:?} does not resolve ({e})",
                    self.addr
                ))
            })?
            .collect();
        if addrs.is_empty() {
            return Err(CommError::InvalidConfig(format!(
                "rendezvous address {:?}: host {host:?} resolves to no address",
                self.addr
            )));
        }
        Ok(addrs)
    }

    /// Rank 0: listen, collect every peer's hello, answer all of them.
    fn serve(
        &self,
        addrs: &[SocketAddr],
        host: &str,
        make_id: impl FnOnce() -> Result<[u8; 128], CommError>,
    ) -> Result<RendezvousOutcome, CommError> {
        let listener = TcpListener::bind(addrs).map_err(|e| {
            // torchrun >= 2.4 keeps its own store on MASTER_ADDR:MASTER_PORT.
            let torchrun = if std::env::var_os("TORCHELASTIC_USE_AGENT_STORE").is_some()
                && std::env::var_os("LOCALSGD_MASTER_PORT").is_none()
            {
                "; under torchrun, whose agent already listens on MASTER_PORT, give this \
                 rendezvous its own port with LOCALSGD_MASTER_PORT"
            } else {
                ""
            };
            self.err(format!(
                "rank 0 cannot listen on {addrs:?} ({e}); is the port already in use (another \
                 job, or a previous run still exiting)? Choose another port or wait{torchrun}"
            ))
        })?;
        let id = make_id()?;
        let deadline = Instant::now() + self.timeout;
        listener
            .set_nonblocking(true)
            .map_err(|e| self.err(format!("cannot configure the listening socket: {e}")))?;
        let mut peers: Vec<Option<TcpStream>> = (0..self.size).map(|_| None).collect();
        let mut hosts: Vec<String> = vec![String::new(); self.size];
        hosts[0] = host.to_string();
        let mut arrived = 1;
        while arrived < self.size {
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (1..self.size).filter(|&r| peers[r].is_none()).collect();
                let e = self.err(format!(
                    "rank(s) {missing:?} did not connect within the timeout; check that every \
                     rank was started with the same address and world size, and that the port \
                     is reachable (firewall)"
                ));
                refuse_all(&mut peers, &e.to_string());
                return Err(e);
            }
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(RETRY.min(deadline - now));
                    continue;
                }
                Err(e) => return Err(self.err(format!("accept failed: {e}"))),
            };
            let hello = stream
                .set_nonblocking(false)
                .and_then(|_| stream.set_read_timeout(Some(remaining(deadline))))
                .and_then(|_| read_hello(&mut stream));
            let (rank, size, peer_host) = match hello {
                Ok(h) => h,
                // A stray connection (port scanner, health check): ignore it.
                Err(e) => {
                    tracing::warn!("rendezvous at {}: ignored a bad connection: {e}", self.addr);
                    continue;
                }
            };
            let problem = if size != self.size {
                Some(format!(
                    "rank {rank} was started with world size {size}, rank 0 with {}",
                    self.size
                ))
            } else if rank == 0 || rank >= self.size {
                Some(format!(
                    "a peer claims rank {rank}, which is not valid (valid peer ranks: 1..{})",
                    self.size
                ))
            } else if peers[rank].is_some() {
                Some(format!(
                    "rank {rank} connected twice (two processes with one rank?)"
                ))
            } else {
                None
            };
            if let Some(p) = problem {
                let e = self.err(&p);
                let _ = write_refusal(&mut stream, &e.to_string());
                refuse_all(&mut peers, &e.to_string());
                return Err(e);
            }
            hosts[rank] = peer_host;
            peers[rank] = Some(stream);
            arrived += 1;
        }
        let mut reply = Vec::with_capacity(256);
        reply.extend_from_slice(&MAGIC.to_le_bytes());
        reply.push(0);
        reply.extend_from_slice(&id);
        for h in &hosts {
            reply.extend_from_slice(&(h.len() as u32).to_le_bytes());
            reply.extend_from_slice(h.as_bytes());
        }
        for (rank, peer) in peers.iter_mut().enumerate() {
            if let Some(s) = peer {
                s.write_all(&reply)
                    .and_then(|_| s.flush())
                    .map_err(|e| self.err(format!("sending the id to rank {rank} failed: {e}")))?;
            }
        }
        Ok(RendezvousOutcome { id, hosts })
    }

    /// Ranks > 0: connect (retrying), say hello, wait for the id.
    fn join(&self, addrs: &[SocketAddr], host: &str) -> Result<RendezvousOutcome, CommError> {
        let deadline = Instant::now() + self.timeout;
        let mut last_error = None;
        let mut stream = loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(self.err(format!(
                    "could not connect to rank 0 within the timeout (last error: {}); check that \
                     rank 0 is running and listens on this address and port",
                    last_error
                        .map_or_else(|| "none".to_string(), |e: std::io::Error| e.to_string())
                )));
            }
            let mut connected = None;
            for a in addrs {
                match TcpStream::connect_timeout(a, remaining(deadline).min(Duration::from_secs(5)))
                {
                    Ok(s) => {
                        connected = Some(s);
                        break;
                    }
                    Err(e) => last_error = Some(e),
                }
            }
            match connected {
                Some(s) => break s,
                None => std::thread::sleep(RETRY.min(remaining(deadline))),
            }
        };
        let io = |e: std::io::Error| {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                self.err(
                    "connected, but rank 0 did not send the id within the timeout (other ranks \
                     did not arrive?)",
                )
            } else {
                self.err(format!("connection to rank 0 failed: {e}"))
            }
        };
        stream.set_nodelay(true).map_err(io)?;
        let mut hello = Vec::with_capacity(32 + host.len());
        hello.extend_from_slice(&MAGIC.to_le_bytes());
        hello.extend_from_slice(&(self.rank as u64).to_le_bytes());
        hello.extend_from_slice(&(self.size as u64).to_le_bytes());
        hello.extend_from_slice(&(host.len() as u32).to_le_bytes());
        hello.extend_from_slice(host.as_bytes());
        stream.write_all(&hello).map_err(io)?;
        stream.flush().map_err(io)?;
        stream
            .set_read_timeout(Some(remaining(deadline)))
            .map_err(io)?;
        let mut head = [0u8; 9];
        stream.read_exact(&mut head).map_err(io)?;
        if u64::from_le_bytes(head[..8].try_into().unwrap_or_default()) != MAGIC {
            return Err(self
                .err("the process at this address is not a localsgd NCCL rendezvous (bad magic)"));
        }
        if head[8] != 0 {
            let message = read_string(&mut stream).map_err(io)?;
            return Err(self.err(format!("rank 0 refused this rank: {message}")));
        }
        let mut id = [0u8; 128];
        stream.read_exact(&mut id).map_err(io)?;
        let hosts = (0..self.size)
            .map(|_| read_string(&mut stream))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        Ok(RendezvousOutcome { id, hosts })
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn read_u64(s: &mut TcpStream) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_string(s: &mut TcpStream) -> std::io::Result<String> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    let len = u32::from_le_bytes(b) as usize;
    if len > 64 * 1024 {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("string of {len} bytes"),
        ));
    }
    let mut v = vec![0u8; len];
    s.read_exact(&mut v)?;
    Ok(String::from_utf8_lossy(&v).into_owned())
}

fn read_hello(s: &mut TcpStream) -> std::io::Result<(usize, usize, String)> {
    if read_u64(s)? != MAGIC {
        return Err(std::io::Error::new(ErrorKind::InvalidData, "bad magic"));
    }
    let rank = read_u64(s)? as usize;
    let size = read_u64(s)? as usize;
    let host = read_string(s)?;
    Ok((rank, size, host))
}

fn write_refusal(s: &mut TcpStream, message: &str) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(16 + message.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(1);
    out.extend_from_slice(&(message.len() as u32).to_le_bytes());
    out.extend_from_slice(message.as_bytes());
    s.write_all(&out)?;
    s.flush()
}

fn refuse_all(peers: &mut [Option<TcpStream>], message: &str) {
    for s in peers.iter_mut().flatten() {
        let _ = write_refusal(s, message);
    }
}

/// Split `host:port` (or `[v6]:port`); the port must be 1..=65535.
pub fn split_host_port(addr: &str) -> Result<(&str, u16), CommError> {
    let bad = |why: &str| {
        CommError::InvalidConfig(format!(
            "rendezvous address {addr:?}: {why} (expected host:port, e.g. 10.0.0.1:29500 or \
             [::1]:29500, with a port in 1..=65535)"
        ))
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port given"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| bad(&format!("port {port:?} is not a number in 1..=65535")))?;
    if port == 0 {
        return Err(bad(
            "port 0 is not allowed (the other ranks could not know the port)",
        ));
    }
    Ok((host, port))
}
