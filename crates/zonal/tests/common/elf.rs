//! Reads the string entries of an ELF64 little-endian file's dynamic section (`DT_SONAME`,
//! `DT_NEEDED`): enough to check the C libraries' SONAMEs without depending on binutils
//! (where `readelf` exists the tests compare with it too). Shared by crates/zonal's and
//! crates/numab's tests/c_abi.rs; every read is bounds-checked, so a malformed file is an
//! `Err`, never a panic.

/// `DT_NEEDED`: a library the object needs.
pub const DT_NEEDED: u64 = 1;
/// `DT_SONAME`: the object's own shared-object name.
pub const DT_SONAME: u64 = 14;

const SHT_DYNAMIC: u64 = 6;
const DT_NULL: u64 = 0;

fn bytes<const N: usize>(f: &[u8], at: u64) -> Result<[u8; N], String> {
    let at = usize::try_from(at).map_err(|_| format!("offset {at:#x} too large"))?;
    at.checked_add(N)
        .and_then(|end| f.get(at..end))
        .map(|s| s.try_into().expect("slice of length N"))
        .ok_or_else(|| format!("read of {N} bytes at {at:#x} past the end ({:#x})", f.len()))
}

fn u16_at(f: &[u8], at: u64) -> Result<u64, String> {
    Ok(u16::from_le_bytes(bytes(f, at)?).into())
}

fn u32_at(f: &[u8], at: u64) -> Result<u64, String> {
    Ok(u32::from_le_bytes(bytes(f, at)?).into())
}

fn u64_at(f: &[u8], at: u64) -> Result<u64, String> {
    Ok(u64::from_le_bytes(bytes(f, at)?))
}

/// The NUL-terminated string at `at`.
fn c_str(f: &[u8], at: u64) -> Result<String, String> {
    let start = usize::try_from(at).map_err(|_| format!("string offset {at:#x} too large"))?;
    let tail = f.get(start..).ok_or_else(|| format!("string at {at:#x} past the end"))?;
    let len = tail.iter().position(|&b| b == 0).ok_or_else(|| format!("unterminated string at {at:#x}"))?;
    String::from_utf8(tail[..len].to_vec()).map_err(|_| format!("string at {at:#x} is not UTF-8"))
}

/// Every `(tag, string)` of the dynamic section whose tag is one of `tags`, in file order.
pub fn dynamic_strings(f: &[u8], tags: &[u64]) -> Result<Vec<(u64, String)>, String> {
    if f.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err("not an ELF file".into());
    }
    if f.get(4..6) != Some([2u8, 1].as_slice()) {
        return Err("not ELF64 little-endian".into());
    }
    let (shoff, shentsize, shnum) = (u64_at(f, 0x28)?, u16_at(f, 0x3a)?, u16_at(f, 0x3c)?);
    let section = |i: u64| shoff + i * shentsize;
    let mut out = Vec::new();
    for i in 0..shnum {
        let sh = section(i);
        if u32_at(f, sh + 4)? != SHT_DYNAMIC {
            continue;
        }
        let (offset, size, link) = (u64_at(f, sh + 0x18)?, u64_at(f, sh + 0x20)?, u32_at(f, sh + 0x28)?);
        if link >= shnum {
            return Err(format!("dynamic section links string table {link} of {shnum}"));
        }
        let strtab = u64_at(f, section(link) + 0x18)?;
        for e in (offset..offset + size).step_by(16) {
            let (tag, val) = (u64_at(f, e)?, u64_at(f, e + 8)?);
            if tag == DT_NULL {
                break;
            }
            if tags.contains(&tag) {
                out.push((tag, c_str(f, strtab + val)?));
            }
        }
    }
    Ok(out)
}

/// The file's `DT_SONAME`, if it has one.
pub fn soname(path: &std::path::Path) -> Result<Option<String>, String> {
    let f = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(dynamic_strings(&f, &[DT_SONAME])?.into_iter().next().map(|(_, s)| s))
}

/// The file's `DT_NEEDED` entries.
pub fn needed(path: &std::path::Path) -> Result<Vec<String>, String> {
    let f = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(dynamic_strings(&f, &[DT_NEEDED])?.into_iter().map(|(_, s)| s).collect())
}

/// What `readelf -d` says the SONAME is (`Some(None)`: none), or `None` when readelf is not
/// installed (the reader above is then the only check).
pub fn readelf_soname(path: &std::path::Path) -> Option<Option<String>> {
    let out = std::process::Command::new("readelf").arg("-d").arg(path).output().ok()?;
    assert!(out.status.success(), "readelf -d {} failed", path.display());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().find(|l| l.contains("(SONAME)"));
    Some(line.and_then(|l| Some(l.split_once('[')?.1.trim_end().trim_end_matches(']').to_string())))
}
