//! The storage engine a run drives: sled (one instance) or PostgreSQL (one to three).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sled,
    Postgres,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sled => "sled",
            Engine::Postgres => "postgres",
        }
    }
}
