//! The watched directory on disk: a stage's files renamed in atomically (temp file, fsync,
//! rename), its removals removed, and the files read back.

use super::*;

/// Renames a stage's files into `dir` and removes its removals. Returns the renames made.
pub fn write_stage(dir: &Path, stage: &Stage) -> Result<u64> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, content) in &stage.write {
        write_atomic(&dir.join(name), content.as_bytes(), 0o644)?;
    }
    for name in &stage.remove {
        let _ = std::fs::remove_file(dir.join(name));
    }
    Ok(stage.write.len() as u64)
}

pub(super) fn read_dir_files(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(files);
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.file_type()?.is_file() {
            files.insert(name, std::fs::read_to_string(entry.path())?);
        }
    }
    Ok(files)
}
