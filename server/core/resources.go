package core

// Resources is the last sample of the alarm watchdog: what the Prometheus exporter shows as
// rabbitmq_process_resident_memory_bytes, rabbitmq_disk_space_available_bytes, their limits
// and the alarms.
type Resources struct {
	RSS, MemoryLimit    int64 // bytes; MemoryLimit 0 = no memory alarm
	DiskFree, DiskLimit int64 // bytes; DiskFree -1 = unknown, DiskLimit 0 = no limit
	MemoryAlarm         bool
	DiskAlarm           bool
}

// Resources returns the watchdog's last sample (taken every 500 ms), without measuring again.
func (a *Alarms) Resources() Resources {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Resources{RSS: a.rss, MemoryLimit: a.memLimit, DiskFree: a.free, DiskLimit: a.diskLimit,
		MemoryAlarm: a.memory, DiskAlarm: a.disk}
}
