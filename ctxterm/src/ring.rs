//! A bounded byte ring: the scrollback a late watcher gets first. Terminal output is kept
//! here, never logged verbatim.

use std::collections::VecDeque;

/// The last `cap` bytes written.
#[derive(Debug)]
pub struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
}

impl Ring {
    /// A ring holding at most `cap` bytes.
    pub fn new(cap: usize) -> Ring {
        Ring { buf: VecDeque::with_capacity(cap.min(1 << 20)), cap }
    }

    /// Appends, dropping the oldest bytes beyond the capacity.
    pub fn push(&mut self, bytes: &[u8]) {
        let bytes = if bytes.len() > self.cap { &bytes[bytes.len() - self.cap..] } else { bytes };
        let over = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.buf.extend(bytes);
    }

    /// A copy of what is held, oldest first.
    pub fn snapshot(&self) -> Vec<u8> {
        self.buf.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_bytes() {
        let mut r = Ring::new(5);
        r.push(b"abc");
        r.push(b"defg");
        assert_eq!(r.snapshot(), b"cdefg");
        r.push(b"0123456789");
        assert_eq!(r.snapshot(), b"56789");
        let mut z = Ring::new(0);
        z.push(b"x");
        assert!(z.snapshot().is_empty());
    }
}
