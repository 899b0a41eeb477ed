//! Finding the statically linked berth binary that goes into the derived image.
//!
//! The agent runs inside Envoy images that may have no C library at all (scratch, distroless),
//! so only a static binary will do. berth's own executable is used when it is static (every
//! build from this repository is: .cargo/config.toml); otherwise `BERTH_AGENT_BINARY` must name one.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Names the static binary to put into derived images.
pub const ENV_BINARY: &str = "BERTH_AGENT_BINARY";

/// The command that builds the static binary, for messages.
pub const BUILD_HINT: &str = "build berth with plain `cargo build --release` in its repository \
     (static through its .cargo/config.toml; a RUSTFLAGS variable overrides that and links it \
     dynamically) or install the berth package, or set BERTH_AGENT_BINARY to a static berth";

/// The static berth binary: `BERTH_AGENT_BINARY` when set, else this executable when it is
/// statically linked.
pub fn locate() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(ENV_BINARY).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return match is_static(&path) {
            Ok(true) => Ok(path),
            Ok(false) => bail!(
                "{ENV_BINARY}={}: not a statically linked executable (it names a dynamic \
                 loader, which scratch and distroless Envoy images lack); {BUILD_HINT}",
                path.display()
            ),
            Err(e) => Err(e.context(format!("{ENV_BINARY}={}", path.display()))),
        };
    }
    let own = std::env::current_exe().context("cannot find berth's own executable")?;
    if is_static(&own)? {
        return Ok(own);
    }
    bail!(
        "the proxy agent needs a statically linked berth binary, and {} is dynamically linked; \
         {BUILD_HINT}",
        own.display()
    )
}

/// Whether the file is an ELF executable without a program interpreter (`PT_INTERP`): one the
/// kernel runs without a dynamic loader.
pub fn is_static(path: &Path) -> Result<bool> {
    use std::io::Read;
    // The ELF header and program headers sit at the start of the file.
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 * 1024).read_to_end(&mut head))
        .with_context(|| format!("cannot read {}", path.display()))?;
    elf_is_static(&head)
        .with_context(|| format!("{} is not an x86-64 ELF executable", path.display()))
}

fn elf_is_static(elf: &[u8]) -> Result<bool> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| -> Result<u16> {
        Ok(u16::from_le_bytes(
            elf.get(at..at + 2).context("truncated")?.try_into()?,
        ))
    };
    let u32_at = |at: usize| -> Result<u32> {
        Ok(u32::from_le_bytes(
            elf.get(at..at + 4).context("truncated")?.try_into()?,
        ))
    };
    let u64_at = |at: usize| -> Result<u64> {
        Ok(u64::from_le_bytes(
            elf.get(at..at + 8).context("truncated")?.try_into()?,
        ))
    };
    // 64-bit, little-endian ELF.
    if elf.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        bail!("no 64-bit little-endian ELF header");
    }
    let phoff = usize::try_from(u64_at(0x20)?)?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        if u32_at(phoff + i * phentsize)? == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_and_dynamic_executables_are_told_apart() {
        // The test binary is built like berth itself: statically (.cargo/config.toml).
        let own = std::env::current_exe().unwrap();
        assert!(is_static(&own).unwrap(), "{} is not static", own.display());
        // Debian's shell is linked dynamically.
        assert!(!is_static(Path::new("/bin/sh")).unwrap());
        assert!(is_static(Path::new("Cargo.toml")).is_err());
    }

    #[test]
    fn an_elf_without_an_interpreter_is_static() {
        // A minimal ELF64 header with one PT_LOAD program header at offset 64.
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&1u32.to_le_bytes());
        assert!(elf_is_static(&elf).unwrap());
        elf[64..68].copy_from_slice(&3u32.to_le_bytes());
        assert!(!elf_is_static(&elf).unwrap());
        assert!(elf_is_static(&elf[..40]).is_err());
    }
}
