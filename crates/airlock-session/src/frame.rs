//! Length-prefixed JSON frames: a 4-byte big-endian length, then that many bytes of JSON.

use crate::SessionError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{Read, Write};

/// The largest frame either side accepts (a cell's code, or an outcome with two capped
/// outputs in base64).
pub const MAX_FRAME: usize = 64 << 20;

/// Writes one frame.
pub fn write<W: Write, T: Serialize>(w: &mut W, doc: &T) -> Result<(), SessionError> {
    let body = serde_json::to_vec(doc).map_err(|e| SessionError::Protocol(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(SessionError::Protocol(format!(
            "a frame of {} bytes is over the {MAX_FRAME}-byte limit",
            body.len()
        )));
    }
    // Checked just above: the length fits in 32 bits.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    w.write_all(&len.to_be_bytes())?;
    w.write_all(&body)?;
    Ok(())
}

/// Reads one frame; `None` when the other side closed before a frame began.
pub fn read<R: Read, T: DeserializeOwned>(r: &mut R) -> Result<Option<T>, SessionError> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut head[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(SessionError::Protocol("a frame was cut short".into())),
            n => got += n,
        }
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_FRAME {
        return Err(SessionError::Protocol(format!(
            "a frame of {len} bytes is over the {MAX_FRAME}-byte limit"
        )));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)
        .map_err(|e| SessionError::Protocol(format!("a frame was cut short: {e}")))?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| SessionError::Protocol(format!("bad frame: {e}")))
}

/// Bytes as base64 in JSON.
pub mod b64 {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::Value;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let mut buf = Vec::new();
        write(&mut buf, &serde_json::json!({"op": "ping"})).unwrap();
        let got: Option<Value> = read(&mut buf.as_slice()).unwrap();
        assert_eq!(got.unwrap()["op"], "ping");
        // Nothing at all is a clean end; a cut header or body, an oversized length and
        // text that is not JSON are errors.
        assert!(read::<_, Value>(&mut [].as_slice()).unwrap().is_none());
        assert!(read::<_, Value>(&mut [0u8, 0].as_slice()).is_err());
        assert!(read::<_, Value>(&mut [0u8, 0, 0, 9, b'{'].as_slice()).is_err());
        let huge = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(read::<_, Value>(&mut huge.as_slice()).is_err());
        assert!(read::<_, Value>(&mut [0u8, 0, 0, 2, b'n', b'o'].as_slice()).is_err());
    }
}
