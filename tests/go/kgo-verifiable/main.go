// kgo-verifiable-consumer: a franz-go (kgo) consumer group member that reports what it does as JSON
// lines on stdout, the way Kafka's VerifiableConsumer does, so that lowtide's tests can check a
// non-Java KIP-848 client with the same checks (tests/integration/kafka/test_franz_go_consumer_group.py).
//
// It joins --group-id with the KIP-848 consumer group protocol (kgo.ServerSideBalancer: franz-go
// v1.22 keeps the classic protocol unless told, and falls back to it silently when the broker
// lacks ConsumerGroupHeartbeat v1, which is why the tests check the protocol from the broker's side;
// --group-protocol classic leaves it out).
// It polls, prints every record, commits what it consumed synchronously after each poll, and only
// then lets a rebalance run (kgo.BlockRebalanceOnPoll), so a revoked partition's offsets are
// committed before the coordinator gives the partition to another member.
//
// Events (one JSON object a line, "name" says which; like VerifiableConsumer's):
//
//	startup_complete
//	partitions_assigned / partitions_revoked / partitions_lost  {"partitions": [{"topic", "partition"}],
//	                   "assignment": what the member owns after the callback, "member_id", "member_epoch"}
//	                   (the group is cooperative: "partitions" are the ones added or taken away)
//	record_data        {"topic", "partition", "offset", "key", "value"}
//	records_consumed   {"count", "partitions": [{"topic", "partition", "count", "minOffset", "maxOffset"}]}
//	offsets_committed  {"offsets": [{"topic", "partition", "offset", "error"?}], "success", "error"?}
//	shutdown_complete  (after SIGTERM/SIGINT: a last commit, then the member leaves the group)
//
// Logs (kgo's, at --log-level) go to stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// out writes one event a line; callbacks run on kgo's goroutines, so writes are serialized.
type out struct {
	mu sync.Mutex
}

func (o *out) emit(name string, fields map[string]any) {
	event := map[string]any{"name": name, "timestamp": time.Now().UnixMilli()}
	for k, v := range fields {
		event[k] = v
	}
	line, err := json.Marshal(event)
	if err != nil {
		panic(err) // only plain values are emitted
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

type topicPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

func partitionList(m map[string][]int32) []topicPartition {
	list := []topicPartition{}
	for t, ps := range m {
		for _, p := range ps {
			list = append(list, topicPartition{t, p})
		}
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].Topic != list[j].Topic {
			return list[i].Topic < list[j].Topic
		}
		return list[i].Partition < list[j].Partition
	})
	return list
}

type consumer struct {
	out   *out
	cl    *kgo.Client
	owned map[string][]int32 // kgo runs the OnPartitions callbacks one at a time
}

func (c *consumer) membership(cl *kgo.Client) map[string]any {
	member, epoch := cl.GroupMetadata()
	return map[string]any{"member_id": member, "member_epoch": epoch}
}

func (c *consumer) rebalanceEvent(name string, cl *kgo.Client, m map[string][]int32) {
	for t, ps := range m {
		if name == "partitions_assigned" {
			c.owned[t] = append(c.owned[t], ps...)
			continue
		}
		c.owned[t] = slices.DeleteFunc(c.owned[t], func(p int32) bool { return slices.Contains(ps, p) })
		if len(c.owned[t]) == 0 {
			delete(c.owned, t)
		}
	}
	fields := c.membership(cl)
	fields["partitions"] = partitionList(m)
	fields["assignment"] = partitionList(c.owned)
	c.out.emit(name, fields)
}

// commit commits, synchronously, the offsets past every record polled so far that are not committed
// yet, and reports the outcome of each partition. A failed commit is not retried here: its offsets
// stay uncommitted and go out with the next commit.
func (c *consumer) commit(ctx context.Context) {
	offsets := c.cl.UncommittedOffsets()
	if len(offsets) == 0 {
		return
	}
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest,
		resp *kmsg.OffsetCommitResponse, err error) {
		fields := map[string]any{}
		committed := []map[string]any{}
		success := err == nil
		if err != nil {
			fields["error"] = err.Error()
		} else {
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					entry := map[string]any{"topic": t.Topic, "partition": p.Partition,
						"offset": offsets[t.Topic][p.Partition].Offset}
					if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
						entry["error"] = perr.Error()
						success = false
					}
					committed = append(committed, entry)
				}
			}
		}
		fields["offsets"] = committed
		fields["success"] = success
		c.out.emit("offsets_committed", fields)
	})
}

func (c *consumer) process(fetches kgo.Fetches) {
	type span struct {
		count, min, max int64
	}
	spans := map[topicPartition]*span{}
	fetches.EachRecord(func(r *kgo.Record) {
		c.out.emit("record_data", map[string]any{"topic": r.Topic, "partition": r.Partition, "offset": r.Offset,
			"key": nullable(r.Key), "value": nullable(r.Value)})
		tp := topicPartition{r.Topic, r.Partition}
		s := spans[tp]
		if s == nil {
			s = &span{min: r.Offset, max: r.Offset}
			spans[tp] = s
		}
		s.count++
		s.min, s.max = min(s.min, r.Offset), max(s.max, r.Offset)
	})
	if len(spans) == 0 {
		return
	}
	var total int64
	parts := []map[string]any{}
	for tp, s := range spans {
		total += s.count
		parts = append(parts, map[string]any{"topic": tp.Topic, "partition": tp.Partition, "count": s.count,
			"minOffset": s.min, "maxOffset": s.max})
	}
	c.out.emit("records_consumed", map[string]any{"count": total, "partitions": parts})
}

func nullable(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

func main() {
	brokers := flag.String("bootstrap-server", "", "comma-separated host:port list")
	topic := flag.String("topic", "", "topic to consume")
	group := flag.String("group-id", "", "consumer group")
	protocol := flag.String("group-protocol", "consumer", "consumer (KIP-848) or classic (JoinGroup/SyncGroup)")
	assignor := flag.String("assignor", "uniform", "server assignor: uniform (kgo's cooperative-sticky) or range")
	logLevel := flag.String("log-level", "info", "kgo log level on stderr: error, warn, info, debug")
	maxPoll := flag.Int("max-poll-records", 500, "records a poll returns at most")
	backoffMax := flag.Duration("retry-backoff-max", 0, "longest wait between retries (0: kgo's, up to 5s); "+
		"keep it well under the coordinator's session timeout when that is shortened")
	flag.Parse()
	if *brokers == "" || *topic == "" || *group == "" {
		fmt.Fprintln(os.Stderr, "usage: kgo-verifiable-consumer --bootstrap-server H:P --topic T --group-id G [--assignor uniform|range]")
		os.Exit(2)
	}
	// franz-go names the server assignor after its first balancer: StickyBalancer and
	// CooperativeStickyBalancer ask for "uniform", RangeBalancer for "range".
	var balancer kgo.GroupBalancer
	switch *assignor {
	case "uniform":
		balancer = kgo.CooperativeStickyBalancer()
	case "range":
		balancer = kgo.RangeBalancer()
	default:
		fmt.Fprintf(os.Stderr, "kgo-verifiable-consumer: unknown --assignor %q (uniform or range)\n", *assignor)
		os.Exit(2)
	}
	if *protocol != "consumer" && *protocol != "classic" {
		fmt.Fprintf(os.Stderr, "kgo-verifiable-consumer: unknown --group-protocol %q (consumer or classic)\n", *protocol)
		os.Exit(2)
	}
	level := map[string]kgo.LogLevel{"error": kgo.LogLevelError, "warn": kgo.LogLevelWarn,
		"info": kgo.LogLevelInfo, "debug": kgo.LogLevelDebug}[*logLevel]

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c := &consumer{out: &out{}, owned: map[string][]int32{}}
	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(*brokers, ",")...),
		kgo.ConsumerGroup(*group),
		kgo.ConsumeTopics(*topic),
		kgo.Balancers(balancer),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, m map[string][]int32) {
			c.rebalanceEvent("partitions_assigned", cl, m)
		}),
		// With autocommit off the revoked partitions' offsets are ours to commit before they move
		// (BlockRebalanceOnPoll already committed everything polled; this catches the rest).
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
			c.commit(ctx)
			c.rebalanceEvent("partitions_revoked", cl, m)
		}),
		kgo.OnPartitionsLost(func(_ context.Context, cl *kgo.Client, m map[string][]int32) {
			c.rebalanceEvent("partitions_lost", cl, m)
		}),
		kgo.WithLogger(kgo.BasicLogger(os.Stderr, level, nil)),
	}
	if *protocol == "consumer" {
		opts = append(opts, kgo.ServerSideBalancer())
	}
	if *backoffMax > 0 {
		// kgo retries a heartbeat whose broker is down on the same broker (it expects it back),
		// backing off 250ms, 500ms, 1s, ... 5s: with a session timeout of a few seconds, a broker
		// restart outlasted the session. Doubling from 100ms up to the cap is the Java client's way.
		opts = append(opts, kgo.RetryBackoffFn(func(fails int) time.Duration {
			return min(100*time.Millisecond<<min(max(fails-1, 0), 10), *backoffMax)
		}))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kgo-verifiable-consumer: %v\n", err)
		os.Exit(1)
	}
	c.cl = cl
	c.out.emit("startup_complete", nil)

	for ctx.Err() == nil {
		fetches := cl.PollRecords(ctx, *maxPoll)
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				fmt.Fprintf(os.Stderr, "kgo-verifiable-consumer: fetch %s-%d: %v\n", t, p, err)
			}
		})
		c.process(fetches)
		commitCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.commit(commitCtx)
		cancel()
		cl.AllowRebalance()
	}

	// SIGTERM: what was consumed is committed above; leaving sends a heartbeat with member epoch -1
	// (after OnPartitionsRevoked).
	closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl.AllowRebalance()
	if err := cl.LeaveGroupContext(closeCtx); err != nil {
		fmt.Fprintf(os.Stderr, "kgo-verifiable-consumer: leaving the group: %v\n", err)
	}
	cl.Close()
	c.out.emit("shutdown_complete", nil)
}
