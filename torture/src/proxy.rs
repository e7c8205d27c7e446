//! A TCP proxy of the harness's own between the instances and PostgreSQL (or PgBouncer): it can
//! cut every open connection at once (a reset, as a network partition or a restarted middlebox
//! does) or stop forwarding for a while (a black hole: bytes wait, nothing answers), and it can
//! be pointed at another server (a rebuilt standby after a failover) without the instances'
//! URL changing.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    upstream: AtomicU16,
    /// Bumped by `cut_all`: every connection opened before it ends with a reset.
    generation: watch::Sender<u64>,
    /// True while forwarding is stopped.
    blackhole: watch::Sender<bool>,
    pub connections: AtomicU64,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> std::io::Result<Arc<Proxy>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (generation, _) = watch::channel(0u64);
        let (blackhole, _) = watch::channel(false);
        let p = Arc::new(Proxy {
            port,
            upstream: AtomicU16::new(upstream_port),
            generation,
            blackhole,
            connections: AtomicU64::new(0),
        });
        tokio::spawn(p.clone().accept(listener));
        Ok(p)
    }

    /// Listens on `ip` too, on the same port (instances in network namespaces reach the host
    /// there: netns.rs).
    pub async fn listen_also(self: &Arc<Self>, ip: std::net::Ipv4Addr) -> std::io::Result<()> {
        let listener = TcpListener::bind((ip, self.port)).await?;
        tokio::spawn(self.clone().accept(listener));
        Ok(())
    }

    async fn accept(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            self.connections.fetch_add(1, Ordering::Relaxed);
            let me = self.clone();
            tokio::spawn(async move { me.serve(client).await });
        }
    }

    pub fn upstream(&self) -> u16 {
        self.upstream.load(Ordering::SeqCst)
    }

    pub fn retarget(&self, port: u16) {
        self.upstream.store(port, Ordering::SeqCst);
    }

    /// Drops every open connection at once, with a reset on both sides.
    pub fn cut_all(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn set_blackhole(&self, on: bool) {
        self.blackhole.send_replace(on);
    }

    async fn serve(self: Arc<Self>, client: TcpStream) {
        let mut gen_rx = self.generation.subscribe();
        let my_gen = *gen_rx.borrow_and_update();
        let mut hole = self.blackhole.subscribe();
        // A black hole holds new connections too: they wait here, unanswered.
        while *hole.borrow_and_update() {
            tokio::select! {
                r = hole.changed() => if r.is_err() { return },
                _ = gen_rx.changed() => { reset(&client); return; }
            }
        }
        let upstream = match TcpStream::connect(("127.0.0.1", self.upstream())).await {
            Ok(s) => s,
            Err(_) => {
                reset(&client);
                return;
            }
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let fds = [client.as_raw_fd(), upstream.as_raw_fd()];
        let (cr, cw) = client.into_split();
        let (ur, uw) = upstream.into_split();
        let both = async {
            tokio::join!(
                pump(cr, uw, self.blackhole.subscribe()),
                pump(ur, cw, self.blackhole.subscribe())
            )
        };
        let cut = async {
            loop {
                if gen_rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                if *gen_rx.borrow() != my_gen {
                    return;
                }
            }
        };
        tokio::pin!(both);
        tokio::select! {
            _ = &mut both => {}
            _ = cut => {
                // The halves are still open inside `both`: make their close a reset, then
                // drop them (leaving this scope).
                for fd in fds {
                    linger_zero(fd);
                }
            }
        }
    }
}

/// SO_LINGER 0 on an open socket: its close sends a reset, as a cut link does.
fn linger_zero(fd: std::os::fd::RawFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: fd is an open socket owned by a half that is alive at this point; setsockopt
    // only reads the struct passed by pointer with its exact size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// SO_LINGER 0 on a socket about to be dropped.
fn reset(s: &TcpStream) {
    linger_zero(s.as_raw_fd());
}

/// Copies one direction until EOF or an error, holding bytes while the black hole is on; at
/// the end it half-closes the other side, so the opposite direction ends too.
async fn pump(
    r: tokio::net::tcp::OwnedReadHalf,
    w: tokio::net::tcp::OwnedWriteHalf,
    hole: watch::Receiver<bool>,
) -> (
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
) {
    let (r, mut w) = copy(r, w, hole).await;
    let _ = w.shutdown().await;
    (r, w)
}

async fn copy(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    mut hole: watch::Receiver<bool>,
) -> (
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        while *hole.borrow_and_update() {
            if hole.changed().await.is_err() {
                return (r, w);
            }
        }
        let n = tokio::select! {
            n = r.read(&mut buf) => match n { Ok(n) => n, Err(_) => return (r, w) },
            ch = hole.changed() => { if ch.is_err() { return (r, w) } continue }
        };
        if n == 0 {
            return (r, w);
        }
        // Bytes read before a black hole began are held until it ends, like a link that
        // stopped mid-packet.
        while *hole.borrow_and_update() {
            if hole.changed().await.is_err() {
                return (r, w);
            }
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return (r, w);
        }
    }
}
