//! Fuzz target bodies, shared by `fuzz/fuzz_targets/` (cargo-fuzz) and the regression test
//! that replays the committed corpus (`tests/fuzz_regressions.rs`). Not part of the API.
//!
//! Each body takes arbitrary bytes and panics when an invariant breaks; errors the product
//! returns for bad input are fine.

use crate::stream::{
    self, AgentMessage, Decoder, ServerMessage, Version, MAX_FRAME_BYTES, VERSION,
};

/// The [`Decoder`] fed arbitrary bytes in arbitrary chunks.
///
/// Input layout:
///
/// - byte 0, flags: bit 0 picks the message type ([`AgentMessage`] or [`ServerMessage`]);
///   bit 1 picks *framed* mode, where the rest of the input is split on NUL bytes (which
///   valid JSON never contains) and each piece is given a correct length prefix, so that
///   the fuzzer explores the messages rather than the framing;
///   bit 2 instead reads the rest as a [`VERSION_HEADER`](stream::VERSION_HEADER) value;
/// - byte 1, chunking: 0 pushes one byte at a time, 255 everything at once, anything else
///   seeds the chunk sizes;
/// - the rest: the stream (raw mode) or the JSON payloads (framed mode).
///
/// Invariants: every decoded message encodes and decodes back to itself; after the decoder
/// has given every complete message, it holds less than one frame (`4 + MAX_FRAME_BYTES`
/// bytes, and less than the frame it waits for); a prefix over the limit is refused as soon
/// as it is seen; a clean end is reported exactly when nothing is pending; a version that
/// parses prints as text that parses to it. No panic on any input. Decoding stops at the
/// first error, as the server and the agent do.
pub fn wire_decoder(data: &[u8]) {
    let [flags, chunking, rest @ ..] = data else {
        return;
    };
    if flags & 4 != 0 {
        version(rest);
        return;
    }
    let stream = if flags & 2 != 0 {
        frame_pieces(rest)
    } else {
        rest.to_vec()
    };
    if flags & 1 == 0 {
        decode_all::<AgentMessage>(&stream, *chunking);
    } else {
        decode_all::<ServerMessage>(&stream, *chunking);
    }
}

/// [`Version`]'s `FromStr` and `Display`, and [`Version::check`].
fn version(text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    let Ok(v) = text.parse::<Version>() else {
        return;
    };
    let printed = v.to_string();
    assert_eq!(
        printed.parse::<Version>().ok(),
        Some(v),
        "{text:?} → {printed:?}"
    );
    assert_eq!(Version::check(v).is_ok(), v.major == VERSION.major);
}

/// Gives each NUL-separated piece of `payloads` a length prefix.
fn frame_pieces(payloads: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payloads.len() + 16);
    for piece in payloads.split(|&b| b == 0) {
        let len = u32::try_from(piece.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(piece);
    }
    out
}

/// Splits `stream` into chunks as `seed` says.
fn chunks(stream: &[u8], seed: u8) -> Vec<&[u8]> {
    match seed {
        0 => stream.chunks(1).collect(),
        255 => vec![stream],
        _ => {
            let mut state = u32::from(seed).wrapping_mul(2_654_435_761) | 1;
            let mut out = Vec::new();
            let mut rest = stream;
            while !rest.is_empty() {
                // xorshift32: chunk sizes from 1 to 64, biased small.
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let size = 1 + (state % 64) as usize / (1 + (state >> 30) as usize);
                let (head, tail) = rest.split_at(size.min(rest.len()));
                out.push(head);
                rest = tail;
            }
            out
        }
    }
}

fn decode_all<T>(stream: &[u8], seed: u8)
where
    T: serde::Serialize + for<'de> serde::Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let mut decoder = Decoder::new();
    // A model of the framing: bytes pushed so far, and where the next frame starts.
    let mut pushed = 0usize;
    let mut frame_start = 0usize;
    for chunk in chunks(stream, seed) {
        decoder.push(chunk);
        pushed += chunk.len();
        loop {
            let announced = announced_len(stream, frame_start);
            match decoder.next_message::<T>() {
                Ok(Some(message)) => {
                    check_round_trip(&message);
                    let Some(len) = announced else {
                        panic!("a message before its length prefix was complete");
                    };
                    frame_start += 4 + len;
                    assert!(frame_start <= pushed, "a message before its bytes arrived");
                }
                Ok(None) => break,
                Err(stream::Error::FrameTooLarge { len }) => {
                    assert!(len > MAX_FRAME_BYTES && announced == Some(len));
                    return;
                }
                // Final: the stream cannot be resynchronised, so stop as the server does.
                Err(_) => return,
            }
        }
        // Nothing complete is left, and less than one frame is held.
        let pending = decoder.pending();
        assert_eq!(pending, pushed - frame_start, "pending bytes");
        assert!(pending < 4 + MAX_FRAME_BYTES, "{pending} bytes held");
        if let Some(len) = announced_len(stream, frame_start).filter(|_| pending >= 4) {
            assert!(
                len <= MAX_FRAME_BYTES,
                "an oversized prefix ({len} bytes) was not refused"
            );
            assert!(
                pending < 4 + len,
                "a complete frame of {len} bytes was held back"
            );
        }
    }
    let pending = decoder.pending();
    match decoder.finish() {
        Ok(()) => assert_eq!(pending, 0, "finish() accepted {pending} pending bytes"),
        Err(stream::Error::Truncated { pending: p }) => {
            assert!(
                pending > 0 && p == pending,
                "Truncated {p} with {pending} pending"
            );
        }
        Err(e) => panic!("finish() failed with {e}"),
    }
}

/// The length the frame starting at `at` announces, if its prefix is there.
fn announced_len(stream: &[u8], at: usize) -> Option<usize> {
    let prefix: [u8; 4] = stream.get(at..at.checked_add(4)?)?.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(prefix)).ok()
}

fn check_round_trip<T>(message: &T)
where
    T: serde::Serialize + for<'de> serde::Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let frame = match stream::encode(message) {
        Ok(frame) => frame,
        // A frame of up to MAX_FRAME_BYTES may re-encode longer (absent defaults written
        // out); nothing else may fail.
        Err(stream::Error::FrameTooLarge { .. }) => return,
        Err(e) => panic!("a decoded message does not encode: {e}"),
    };
    let mut decoder = Decoder::new();
    decoder.push(&frame);
    match decoder.next_message::<T>() {
        Ok(Some(again)) => assert_eq!(&again, message, "re-decoded message differs"),
        Ok(None) => panic!("an encoded frame is incomplete"),
        Err(e) => panic!("an encoded frame does not decode: {e}"),
    }
    assert_eq!(decoder.pending(), 0, "bytes left after one encoded frame");
}
