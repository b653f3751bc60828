//! [`Table`]: the one object table of ferroce (rxe's `rxe_pool` in spirit): objects by a
//! small integer id, with the id allocation, lookup and iteration written once. The engine's
//! PDs, CQs and SRQs, the worker's clients and the client libraries' mirrors of the device's
//! objects all use it.
//!
//! Ids are allocated cyclically by default (`xa_alloc_cyclic`'s policy): after an object
//! goes, its id comes back only once every other free id was handed out, so a stale handle
//! held across a destroy is unlikely to name a new object. A table scanned on a hot path
//! can ask for the lowest free id instead ([`Table::dense`]), which keeps it as short as its
//! peak population. Lookups index a vector; nothing hashes.

/// Objects by id, at most `capacity` of them.
#[derive(Debug, Clone)]
pub struct Table<T> {
    slots: Vec<Option<T>>,
    capacity: usize,
    /// Where the next allocation starts looking (one past the last id handed out).
    next: usize,
    len: usize,
    /// Hand out the lowest free id rather than cyclically.
    dense: bool,
}

impl<T> Table<T> {
    /// An empty table for ids `0..capacity`.
    pub fn new(capacity: usize) -> Table<T> {
        Table {
            slots: Vec::new(),
            capacity,
            next: 0,
            len: 0,
            dense: false,
        }
    }

    /// An empty table for ids `0..capacity` that hands out the lowest free id: its vector
    /// stays as long as its peak population, for tables iterated often.
    pub fn dense(capacity: usize) -> Table<T> {
        Table {
            dense: true,
            ..Table::new(capacity)
        }
    }

    /// How many ids it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// One past the highest id that may be in use: iterating `0..id_bound()` with `get`
    /// visits every object without holding a borrow of the table between them.
    pub fn id_bound(&self) -> usize {
        self.slots.len()
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it holds `capacity` objects.
    pub fn is_full(&self) -> bool {
        self.len >= self.capacity
    }

    /// Stores `v` under a free id (cyclically after the last one handed out) and returns the
    /// id; None when full.
    pub fn insert(&mut self, v: T) -> Option<usize> {
        self.insert_with(|_| v)
    }

    /// Stores the object `make` builds for its id; None (and `make` not called) when full.
    pub fn insert_with(&mut self, make: impl FnOnce(usize) -> T) -> Option<usize> {
        if self.is_full() {
            return None;
        }
        // A free id exists: past the end of the vector (grown lazily), or a hole in it.
        let n = self.slots.len();
        let id = (0..self.capacity)
            .map(|k| (self.next + k) % self.capacity)
            .find(|&i| i >= n || self.slots[i].is_none())?;
        if id >= n {
            self.slots.resize_with(id + 1, || None);
        }
        self.slots[id] = Some(make(id));
        self.len += 1;
        self.next = if self.dense {
            0
        } else {
            (id + 1) % self.capacity
        };
        Some(id)
    }

    /// Stores `v` under `id` (a mirror of ids allocated elsewhere, e.g. the device's), giving
    /// back what was there; `Err(v)` (nothing stored) if `id` is out of range.
    pub fn insert_at(&mut self, id: usize, v: T) -> Result<Option<T>, T> {
        if id >= self.capacity {
            return Err(v);
        }
        if id >= self.slots.len() {
            self.slots.resize_with(id + 1, || None);
        }
        let old = self.slots[id].replace(v);
        if old.is_none() {
            self.len += 1;
        }
        Ok(old)
    }

    /// The object `id` names.
    #[inline]
    pub fn get(&self, id: usize) -> Option<&T> {
        self.slots.get(id)?.as_ref()
    }

    /// The object `id` names, to change.
    #[inline]
    pub fn get_mut(&mut self, id: usize) -> Option<&mut T> {
        self.slots.get_mut(id)?.as_mut()
    }

    /// Whether `id` names an object.
    pub fn contains(&self, id: usize) -> bool {
        self.get(id).is_some()
    }

    /// Takes the object `id` names out; its id is free again (handed out last).
    pub fn remove(&mut self, id: usize) -> Option<T> {
        let v = self.slots.get_mut(id)?.take();
        if v.is_some() {
            self.len -= 1;
        }
        v
    }

    /// The objects with their ids, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|v| (i, v)))
    }

    /// The objects with their ids, in id order, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|v| (i, v)))
    }

    /// The objects, in id order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// The objects, in id order, to change.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().flatten()
    }

    /// Keeps the objects for which `keep` returns true (it may change them), removing the
    /// others; visits in id order.
    pub fn retain(&mut self, mut keep: impl FnMut(usize, &mut T) -> bool) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(v) = s {
                if !keep(i, v) {
                    *s = None;
                    self.len -= 1;
                }
            }
        }
    }

    /// Removes every object.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_back_only_after_the_others() {
        let mut t = Table::new(4);
        assert_eq!(t.insert('a'), Some(0));
        assert_eq!(t.insert('b'), Some(1));
        assert_eq!(t.remove(0), Some('a'));
        // 0 is free, but 2 and 3 were never used: they go first.
        assert_eq!(t.insert('c'), Some(2));
        assert_eq!(t.insert('d'), Some(3));
        assert_eq!(t.insert('e'), Some(0), "then the freed one");
        assert_eq!(t.insert('f'), None, "full");
        assert!(t.is_full());
        assert_eq!(t.len(), 4);
        assert_eq!(t.get(1), Some(&'b'));
        assert_eq!(t.get(9), None);
        assert_eq!(
            t.iter().map(|(i, v)| (i, *v)).collect::<Vec<_>>(),
            [(0, 'e'), (1, 'b'), (2, 'c'), (3, 'd')]
        );
        assert_eq!(t.remove(1), Some('b'));
        assert_eq!(t.remove(1), None, "twice");
        assert_eq!(t.len(), 3);
        assert_eq!(t.insert_with(|id| (b'a' + id as u8) as char), Some(1));
        t.retain(|id, v| {
            *v = v.to_ascii_uppercase();
            id != 2
        });
        assert_eq!(t.values().collect::<String>(), "EBD");
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn a_dense_table_reuses_the_lowest_id() {
        let mut t = Table::dense(4);
        assert_eq!(t.insert(1), Some(0));
        assert_eq!(t.insert(2), Some(1));
        assert_eq!(t.remove(0), Some(1));
        assert_eq!(t.insert(3), Some(0));
        assert_eq!(t.insert(4), Some(2));
    }

    #[test]
    fn mirrors_store_at_given_ids() {
        let mut t = Table::new(8);
        assert_eq!(t.insert_at(5, 50), Ok(None));
        assert_eq!(t.insert_at(5, 51), Ok(Some(50)));
        assert_eq!(t.insert_at(8, 80), Err(80), "out of range");
        assert_eq!(t.len(), 1);
        assert_eq!(t.values().copied().collect::<Vec<_>>(), [51]);
        *t.get_mut(5).unwrap() += 1;
        assert_eq!(t.remove(5), Some(52));
        assert!(t.is_empty());
    }

    #[test]
    fn a_zero_capacity_table_holds_nothing() {
        let mut t: Table<u8> = Table::new(0);
        assert_eq!(t.insert(1), None);
        assert_eq!(t.insert_at(0, 1), Err(1));
    }
}
