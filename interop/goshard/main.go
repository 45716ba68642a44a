// Command goshard is a BigFleet shard peer built on Go's own gRPC stack (grpc-go's HTTP/2
// transport, protobuf-go's codec), for interoperability tests of the Python agent
// (docs/wire.md#go-interop).
//
// Server mode (default) serves Shard.Session with the upstream shard's server options: 256 MiB
// message limits, grpc-go's default keepalive enforcement unless -keepalive-min-time tightens or
// loosens it, optional mTLS (TLS 1.3, client certificate with a bigfleet://cluster/<id> URI SAN).
// Each session plays a scripted downlink (-script) and every uplink frame is recorded as
// protobuf-go decoded it (-record, JSON lines).
//
// Client mode (-dial) is the reverse direction: a grpc-go client that plays a scripted uplink
// against a shard (e.g. `bigfleet-trio sim shard`) and records every downlink frame.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/bigfleet-trio/interop/goshard/bigfleetpb"
)

// MaxMessageBytes is the upstream shard's message limit, both ways.
const MaxMessageBytes = 256 << 20

// SANPrefix is the URI SAN prefix a client certificate must carry under mTLS.
const SANPrefix = "bigfleet://cluster/"

// ---- recording ----------------------------------------------------------------------------

// Recorder writes one JSON object per line; safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (r *Recorder) Put(rec map[string]any) {
	rec["at_ms"] = float64(time.Since(r.start).Microseconds()) / 1000
	line, err := json.Marshal(rec)
	if err != nil {
		log.Printf("record: %v", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.Write(append(line, '\n'))
}

var jsonOpts = protojson.MarshalOptions{UseProtoNames: true}

// frameRecord describes one frame as protobuf-go decoded it: its oneof kind, its JSON form, and
// whether protobuf-go's deterministic re-encoding gives back the exact bytes that arrived.
func frameRecord(dir string, session int64, seq int, m proto.Message, raw []byte, withJSON bool) map[string]any {
	re, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	rec := map[string]any{
		"t": dir, "session": session, "seq": seq, "kind": kindOf(m),
		"raw_len": len(raw), "reencoded_len": len(re),
		"reencoded_identical": err == nil && string(re) == string(raw),
		"raw_sha256":          sha(raw),
	}
	if withJSON {
		if js, err := jsonOpts.Marshal(m); err == nil {
			rec["frame"] = json.RawMessage(js)
		}
		rec["raw_b64"] = base64.StdEncoding.EncodeToString(raw)
		if !rec["reencoded_identical"].(bool) {
			rec["reencoded_b64"] = base64.StdEncoding.EncodeToString(re)
		}
	}
	return rec
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// kindOf names the set field of the `payload` oneof ("" when none is set).
func kindOf(m proto.Message) string {
	r := m.ProtoReflect()
	od := r.Descriptor().Oneofs().ByName("payload")
	if od == nil {
		return ""
	}
	if f := r.WhichOneof(od); f != nil {
		return string(f.Name())
	}
	return ""
}

// ---- raw-capturing codec ------------------------------------------------------------------

// captureCodec is protobuf-go's codec that also keeps the received bytes of each envelope, so
// the recorder can compare them with protobuf-go's own re-encoding.
type captureCodec struct{ raw sync.Map }

func (c *captureCodec) Name() string { return "proto" }

func (c *captureCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*preEncoded); ok {
		return b.data, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (c *captureCodec) Unmarshal(data []byte, v any) error {
	m := v.(proto.Message)
	c.raw.Store(m, append([]byte(nil), data...))
	return proto.Unmarshal(data, m)
}

func (c *captureCodec) take(m proto.Message) []byte {
	if b, ok := c.raw.LoadAndDelete(m); ok {
		return b.([]byte)
	}
	return nil
}

// preEncoded is a frame already marshalled (the burst sends the same bytes many times faster).
type preEncoded struct{ data []byte }

var codec = &captureCodec{}

func init() { encoding.RegisterCodec(codec) }

// ---- HTTP/2 frame sniffing (pings and GOAWAYs) --------------------------------------------

// sniffer follows the HTTP/2 frames of one direction of a connection and records PING and
// GOAWAY frames (grpc-go does not surface them to the application).
type sniffer struct {
	rec     *Recorder
	conn    int64
	dir     string
	preface int // bytes of the client connection preface still to skip
	hdr     []byte
	left    int
	keep    bool
	ftype   byte
	flags   byte
	payload []byte
}

func (s *sniffer) feed(b []byte) {
	for len(b) > 0 {
		if s.preface > 0 {
			n := min(s.preface, len(b))
			s.preface -= n
			b = b[n:]
			continue
		}
		if s.left == 0 && len(s.hdr) < 9 {
			n := min(9-len(s.hdr), len(b))
			s.hdr = append(s.hdr, b[:n]...)
			b = b[n:]
			if len(s.hdr) < 9 {
				return
			}
			s.left = int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
			s.ftype, s.flags = s.hdr[3], s.hdr[4]
			s.keep = s.ftype == 6 || s.ftype == 7 // PING, GOAWAY
			s.payload = s.payload[:0]
			if s.left == 0 {
				s.done()
			}
			continue
		}
		n := min(s.left, len(b))
		if s.keep {
			s.payload = append(s.payload, b[:n]...)
		}
		s.left -= n
		b = b[n:]
		if s.left == 0 {
			s.done()
		}
	}
}

func (s *sniffer) done() {
	s.hdr = s.hdr[:0]
	switch {
	case s.ftype == 6:
		s.rec.Put(map[string]any{"t": "ping", "dir": s.dir, "conn": s.conn, "ack": s.flags&1 == 1})
	case s.ftype == 7 && len(s.payload) >= 8:
		code := uint32(s.payload[4])<<24 | uint32(s.payload[5])<<16 | uint32(s.payload[6])<<8 | uint32(s.payload[7])
		s.rec.Put(map[string]any{"t": "goaway", "dir": s.dir, "conn": s.conn, "code": code,
			"debug": string(s.payload[8:])})
	}
}

type sniffConn struct {
	net.Conn
	in, out *sniffer
	mu      sync.Mutex
}

func (c *sniffConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.feed(b[:n])
	return n, err
}

func (c *sniffConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.out.feed(b)
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// sniffCreds wraps transport credentials so the connection grpc-go reads (after any TLS
// handshake) is the sniffed one; handshake failures are recorded.
type sniffCreds struct {
	credentials.TransportCredentials
	rec   *Recorder
	conns atomic.Int64
}

func (c *sniffCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.rec.Put(map[string]any{"t": "handshake_refused", "error": err.Error()})
		return nil, nil, err
	}
	id := c.conns.Add(1)
	c.rec.Put(map[string]any{"t": "conn", "conn": id})
	return &sniffConn{
		Conn: conn,
		in:   &sniffer{rec: c.rec, conn: id, dir: "in", preface: 24},
		out:  &sniffer{rec: c.rec, conn: id, dir: "out"},
	}, info, nil
}

func (c *sniffCreds) Clone() credentials.TransportCredentials {
	return &sniffCreds{TransportCredentials: c.TransportCredentials.Clone(), rec: c.rec}
}

// ---- scripts ------------------------------------------------------------------------------

// Step is one line of a scripted session. Exactly one field is set.
type Step struct {
	// Send one envelope, given in protobuf JSON (ShardMessage in server mode, OperatorMessage in
	// client mode).
	Send json.RawMessage `json:"send,omitempty"`
	// Await waits for the Count-th frame of this oneof kind in this session (Count 0 = 1).
	Await string `json:"await,omitempty"`
	Count int    `json:"count,omitempty"`
	// Sleep for a Go duration.
	Sleep string `json:"sleep,omitempty"`
	// WaitFile waits until this file exists (a gate the test opens once it has checked the
	// agent's reaction to the frames so far).
	WaitFile string `json:"wait_file,omitempty"`
	// Burst of NodeStateUpdates with interleaved BootstrapRequests (server mode).
	Burst *Burst `json:"burst,omitempty"`
	// AwaitBootstrapAnswers waits until every BootstrapRequest sent so far was answered.
	AwaitBootstrapAnswers bool `json:"await_bootstrap_answers,omitempty"`
	// End the stream with this gRPC status (server mode).
	End *EndStatus `json:"end,omitempty"`
	// CloseSend half-closes the uplink and waits for the shard's status (client mode).
	CloseSend bool `json:"close_send,omitempty"`
	// Timeout for awaits (Go duration, default 60s).
	Timeout string `json:"timeout,omitempty"`
}

// Burst sends Machines x len(States) NodeStateUpdates in waves (every machine in the first
// state, then every machine in the next...), and one BootstrapRequest after every
// BootstrapEvery updates.
type Burst struct {
	ClusterID      string   `json:"cluster_id"`
	Machines       int      `json:"machines"`
	States         []string `json:"states"`
	BootstrapEvery int      `json:"bootstrap_every"`
}

// EndStatus is a gRPC status code (number) and message.
type EndStatus struct {
	Code    uint32 `json:"code"`
	Message string `json:"message"`
}

// Script: Sessions[i] is played on the (i+1)-th session; later sessions play Default.
type Script struct {
	Sessions [][]Step `json:"sessions"`
	Default  []Step   `json:"default"`
}

func (s *Script) forSession(n int64) []Step {
	if int(n) <= len(s.Sessions) {
		return s.Sessions[n-1]
	}
	return s.Default
}

// counts tracks frames received per kind in one session, with waiters.
type counts struct {
	mu      sync.Mutex
	n       map[string]int
	changed chan struct{}
	ended   bool
}

func newCounts() *counts { return &counts{n: map[string]int{}, changed: make(chan struct{})} }

func (c *counts) add(kind string) {
	c.mu.Lock()
	c.n[kind]++
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *counts) end() {
	c.mu.Lock()
	c.ended = true
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *counts) wait(ctx context.Context, kind string, want int, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		got, ended, ch := c.n[kind], c.ended, c.changed
		c.mu.Unlock()
		if got >= want {
			return nil
		}
		if ended {
			return fmt.Errorf("stream ended with %d of %d %s frames", got, want, kind)
		}
		select {
		case <-ch:
		case <-deadline:
			return fmt.Errorf("timed out with %d of %d %s frames", got, want, kind)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// bootstraps tracks BootstrapRequests sent and their answers (deadline: the shard's 10 s).
type bootstraps struct {
	mu       sync.Mutex
	sent     map[string]time.Time
	open     int
	answered chan struct{}
}

func newBootstraps() *bootstraps {
	return &bootstraps{sent: map[string]time.Time{}, answered: make(chan struct{}, 1)}
}

func (b *bootstraps) sentNow(id string) {
	b.mu.Lock()
	b.sent[id] = time.Now()
	b.open++
	b.mu.Unlock()
}

func (b *bootstraps) answer(id string) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	at, ok := b.sent[id]
	if !ok {
		return 0, false
	}
	delete(b.sent, id)
	b.open--
	select {
	case b.answered <- struct{}{}:
	default:
	}
	return time.Since(at), true
}

func (b *bootstraps) outstanding() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// recvLoop receives frames until the stream ends. Each frame is handed to onFrame with its
// sequence number in the session (from 1); the kinds onFrame returns are then counted in seen,
// in that order, for the script's awaits. When Recv fails, seen is ended (so awaits give up) and
// the error is sent on done (buffered by the caller). Both modes run it: the server over
// OperatorMessages, the client over ShardMessages.
func recvLoop[M proto.Message](recv func() (M, error), seen *counts, done chan<- error,
	onFrame func(seq int, m M) []string) {
	for seq := 1; ; seq++ {
		m, err := recv()
		if err != nil {
			seen.end()
			done <- err
			return
		}
		for _, kind := range onFrame(seq, m) {
			seen.add(kind)
		}
	}
}

func waitFile(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", path)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func duration(s string, def time.Duration) time.Duration {
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		log.Fatalf("bad duration %q: %v", s, err)
	}
	return d
}

// ---- server mode --------------------------------------------------------------------------

type server struct {
	pb.UnimplementedShardServer
	rec       *Recorder
	script    *Script
	sessions  atomic.Int64
	clusterID string // with mTLS: the SAN's cluster id must be this one ("" = any)
	deadline  time.Duration
}

func (s *server) Session(stream grpc.BidiStreamingServer[pb.OperatorMessage, pb.ShardMessage]) error {
	ctx := stream.Context()
	n := s.sessions.Add(1)
	open := map[string]any{"t": "open", "session": n}
	san := ""
	if p, ok := peer.FromContext(ctx); ok {
		open["peer"] = p.Addr.String()
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			open["tls_version"] = tls.VersionName(ti.State.Version)
			san = clusterSAN(ti.State.PeerCertificates)
			open["san_cluster_id"] = san
		}
	}
	s.rec.Put(open)
	seen := newCounts()
	boots := newBootstraps()
	recvErr := make(chan error, 1)
	go recvLoop(stream.Recv, seen, recvErr, func(seq int, m *pb.OperatorMessage) []string {
		raw := codec.take(m)
		kind := kindOf(m)
		// The roll-ups and the handshake are recorded in full (up to -record-full-max
		// bytes); high-rate answers briefly.
		full := (kind == "hello" || kind == "rollup" || kind == "reclaim_ack" || seq <= 50) &&
			len(raw) <= *recordFullMax
		rec := frameRecord("up", n, seq, m, raw, full)
		if r := m.GetRollup(); r != nil {
			rec["needs"] = len(r.GetNeeds())
		}
		s.rec.Put(rec)
		if r := m.GetBootstrapResponse(); r != nil {
			if d, ok := boots.answer(r.GetRequestId()); ok {
				s.rec.Put(map[string]any{"t": "bootstrap_answer", "session": n,
					"request_id": r.GetRequestId(), "ms": float64(d.Microseconds()) / 1000,
					"late": d > s.deadline, "error": r.GetError()})
			}
		}
		if h := m.GetHello(); h != nil && san != "" && h.GetClusterId() != san {
			// A certificate for one cluster cannot speak for another.
			s.rec.Put(map[string]any{"t": "hello_refused", "session": n,
				"cluster_id": h.GetClusterId(), "san_cluster_id": san})
		}
		return []string{kind}
	})
	err := s.play(ctx, stream, n, seen, boots)
	if err == nil {
		// Script done: hold the stream open until the agent ends it.
		err = <-recvErr
		if errors.Is(err, io.EOF) {
			err = nil
		}
	}
	st, _ := status.FromError(err)
	s.rec.Put(map[string]any{"t": "end", "session": n, "code": uint32(st.Code()), "message": st.Message(),
		"error": fmt.Sprint(err)})
	return err
}

func (s *server) play(ctx context.Context, stream grpc.BidiStreamingServer[pb.OperatorMessage, pb.ShardMessage],
	n int64, seen *counts, boots *bootstraps) error {
	for i, step := range s.script.forSession(n) {
		timeout := duration(step.Timeout, 60*time.Second)
		switch {
		case step.Send != nil:
			m := &pb.ShardMessage{}
			if err := protojson.Unmarshal(step.Send, m); err != nil {
				return status.Errorf(codes.Internal, "script step %d: %v", i, err)
			}
			if err := stream.Send(m); err != nil {
				return err
			}
			if r := m.GetBootstrapRequest(); r != nil {
				boots.sentNow(r.GetRequestId())
			}
			s.rec.Put(map[string]any{"t": "down", "session": n, "kind": kindOf(m)})
		case step.Await != "":
			if err := seen.wait(ctx, step.Await, max(step.Count, 1), timeout); err != nil {
				s.rec.Put(map[string]any{"t": "await_failed", "session": n, "step": i, "error": err.Error()})
				return status.Errorf(codes.Aborted, "script step %d: %v", i, err)
			}
		case step.Sleep != "":
			select {
			case <-time.After(duration(step.Sleep, 0)):
			case <-ctx.Done():
				return ctx.Err()
			}
		case step.WaitFile != "":
			if err := waitFile(ctx, step.WaitFile, timeout); err != nil {
				s.rec.Put(map[string]any{"t": "await_failed", "session": n, "step": i, "error": err.Error()})
				return status.Errorf(codes.Aborted, "script step %d: %v", i, err)
			}
		case step.Burst != nil:
			if err := s.burst(stream, n, step.Burst, boots); err != nil {
				return err
			}
		case step.AwaitBootstrapAnswers:
			deadline := time.After(timeout)
			for boots.outstanding() > 0 {
				select {
				case <-boots.answered:
				case <-deadline:
					return status.Errorf(codes.Aborted, "%d bootstrap requests unanswered", boots.outstanding())
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			s.rec.Put(map[string]any{"t": "bootstrap_all_answered", "session": n})
		case step.End != nil:
			return status.Error(codes.Code(step.End.Code), step.End.Message)
		}
	}
	return nil
}

func (s *server) burst(stream grpc.BidiStreamingServer[pb.OperatorMessage, pb.ShardMessage], n int64,
	b *Burst, boots *bootstraps) error {
	sent, requests := 0, 0
	for _, st := range b.States {
		state := pb.MachineState(pb.MachineState_value[st])
		for i := range b.Machines {
			id := fmt.Sprintf("burst-%05d", i)
			m := &pb.ShardMessage{Payload: &pb.ShardMessage_NodeStateUpdate{NodeStateUpdate: &pb.NodeStateUpdate{
				SupersedesKey: "node:" + id, MachineId: id, ClusterId: b.ClusterID, State: state,
				Labels:    map[string]string{"node.kubernetes.io/instance-type": "m.burst"},
				Resources: &pb.Resources{Resources: map[string]string{"cpu": "4", "memory": "16Gi"}},
			}}}
			if err := stream.Send(m); err != nil {
				return err
			}
			sent++
			if b.BootstrapEvery > 0 && sent%b.BootstrapEvery == 0 {
				requests++
				rid := fmt.Sprintf("burst-boot-%d", requests)
				req := &pb.ShardMessage{Payload: &pb.ShardMessage_BootstrapRequest{BootstrapRequest: &pb.BootstrapRequest{
					RequestId: rid, ClusterId: b.ClusterID,
					Requirements: []*pb.NodeSelectorRequirement{{Key: "node.kubernetes.io/instance-type",
						Operator: pb.NodeSelectorRequirement_OPERATOR_IN, Values: []string{"m.burst"}}},
				}}}
				boots.sentNow(rid)
				if err := stream.Send(req); err != nil {
					return err
				}
			}
		}
	}
	s.rec.Put(map[string]any{"t": "burst_sent", "session": n, "node_state_updates": sent, "bootstrap_requests": requests})
	return nil
}

// clusterSAN returns the cluster id of the leaf certificate's bigfleet://cluster/<id> URI SAN.
func clusterSAN(chain []*x509.Certificate) string {
	if len(chain) == 0 {
		return ""
	}
	for _, u := range chain[0].URIs {
		if s := u.String(); strings.HasPrefix(s, SANPrefix) {
			return strings.TrimPrefix(s, SANPrefix)
		}
	}
	return ""
}

func serverTLS(cert, key, ca, clusterID string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no CA certificate", ca)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
		VerifyConnection: func(cs tls.ConnectionState) error {
			id := clusterSAN(cs.PeerCertificates)
			if id == "" {
				return errors.New("client certificate has no " + SANPrefix + "<id> URI SAN")
			}
			if clusterID != "" && id != clusterID {
				return fmt.Errorf("client certificate is for cluster %q, not %q", id, clusterID)
			}
			return nil
		},
	}, nil
}

func runServer(rec *Recorder, script *Script) error {
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if *tlsCert != "" {
		cfg, err := serverTLS(*tlsCert, *tlsKey, *tlsCA, *clusterID)
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.ServerOption{
		grpc.Creds(&sniffCreds{TransportCredentials: creds, rec: rec}),
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.ForceServerCodec(codec),
	}
	// No option = grpc-go's default enforcement (MinTime 5 min, no pings without a stream).
	if *kaMinTime > 0 {
		opts = append(opts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: *kaMinTime, PermitWithoutStream: *kaPermit}))
	}
	srv := grpc.NewServer(opts...)
	pb.RegisterShardServer(srv, &server{rec: rec, script: script, clusterID: *clusterID,
		deadline: *bootDeadline})
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	addr := lis.Addr().String()
	rec.Put(map[string]any{"t": "listening", "addr": addr})
	if *readyFile != "" {
		tmp := *readyFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(addr), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, *readyFile); err != nil {
			return err
		}
	}
	return srv.Serve(lis)
}

// ---- client mode --------------------------------------------------------------------------

func runClient(rec *Recorder, script *Script) error {
	conn, err := grpc.NewClient(*dial,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec),
			grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pb.NewShardClient(conn).Session(ctx)
	if err != nil {
		return err
	}
	rec.Put(map[string]any{"t": "open", "session": 1})
	seen := newCounts()
	var sendMu sync.Mutex
	send := func(m *pb.OperatorMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	done := make(chan error, 1)
	go recvLoop(stream.Recv, seen, done, func(seq int, m *pb.ShardMessage) []string {
		rec.Put(frameRecord("down", 1, seq, m, codec.take(m), true))
		// Answer as an agent would, so the shard's side of the protocol moves on.
		if r := m.GetBootstrapRequest(); r != nil {
			_ = send(&pb.OperatorMessage{Payload: &pb.OperatorMessage_BootstrapResponse{
				BootstrapResponse: &pb.BootstrapBlobResponse{RequestId: r.GetRequestId(),
					UserData: []byte("#cloud-config\n"), TtlSeconds: 600}}})
		}
		if r := m.GetReclaimInstruction(); r != nil {
			_ = send(&pb.OperatorMessage{Payload: &pb.OperatorMessage_ReclaimAck{
				ReclaimAck: &pb.ReclaimAck{InstructionId: r.GetInstructionId(),
					NodesStarted: int32(len(r.GetNodes()))}}})
		}
		if u := m.GetNodeStateUpdate(); u != nil {
			// Awaitable as "node_state_update:MACHINE_STATE_<X>" too.
			return []string{kindOf(m), "node_state_update:" + u.GetState().String()}
		}
		return []string{kindOf(m)}
	})
	for i, step := range script.forSession(1) {
		timeout := duration(step.Timeout, 60*time.Second)
		switch {
		case step.Send != nil:
			m := &pb.OperatorMessage{}
			if err := protojson.Unmarshal(step.Send, m); err != nil {
				return fmt.Errorf("script step %d: %v", i, err)
			}
			if r := m.GetRollup(); r != nil && r.TimestampUnixNanos == 0 {
				r.TimestampUnixNanos = time.Now().UnixNano()
			}
			if err := send(m); err != nil {
				return fmt.Errorf("script step %d: %v", i, err)
			}
			rec.Put(map[string]any{"t": "up", "session": 1, "kind": kindOf(m)})
		case step.Await != "":
			if err := seen.wait(ctx, step.Await, max(step.Count, 1), timeout); err != nil {
				rec.Put(map[string]any{"t": "await_failed", "session": 1, "step": i, "error": err.Error()})
				return err
			}
		case step.Sleep != "":
			time.Sleep(duration(step.Sleep, 0))
		case step.CloseSend:
			sendMu.Lock()
			err := stream.CloseSend()
			sendMu.Unlock()
			if err != nil {
				return err
			}
		}
	}
	if !script.closes() {
		cancel()
	}
	err = <-done
	if errors.Is(err, io.EOF) {
		err = nil
	}
	st, _ := status.FromError(err)
	rec.Put(map[string]any{"t": "end", "session": 1, "code": uint32(st.Code()), "message": st.Message()})
	return nil
}

// closes: the client script half-closes the uplink (so the shard ends the call with a status).
func (s *Script) closes() bool {
	for _, st := range s.forSession(1) {
		if st.CloseSend {
			return true
		}
	}
	return false
}

// ---- main ---------------------------------------------------------------------------------

var (
	listen        = flag.String("listen", "127.0.0.1:0", "server mode: listen address")
	readyFile     = flag.String("ready-file", "", "server mode: write the bound address here once listening")
	recordPath    = flag.String("record", "", "JSON-lines record of frames and connection events (default stdout)")
	recordFullMax = flag.Int("record-full-max", 1<<20, "frames above this many bytes are recorded without their JSON and bytes")
	scriptPath    = flag.String("script", "", "JSON script (sessions of steps); none = record and hold")
	kaMinTime     = flag.Duration("keepalive-min-time", 0, "server keepalive enforcement MinTime (0 = grpc-go's default policy, 5m)")
	kaPermit      = flag.Bool("keepalive-permit-without-stream", false, "with -keepalive-min-time: allow pings without a stream")
	tlsCert       = flag.String("tls-cert", "", "server certificate (mTLS: with -tls-key and -tls-ca)")
	tlsKey        = flag.String("tls-key", "", "server private key")
	tlsCA         = flag.String("tls-ca", "", "CA bundle for client certificates")
	clusterID     = flag.String("cluster-id", "", "mTLS: the only cluster id accepted in the URI SAN; client mode: unused")
	bootDeadline  = flag.Duration("bootstrap-deadline", 10*time.Second, "an answer later than this is recorded as late")
	dial          = flag.String("dial", "", "client mode: the shard address to dial")
)

func main() {
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	var out io.Writer = os.Stdout
	if *recordPath != "" {
		f, err := os.Create(*recordPath)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		out = f
	}
	rec := &Recorder{w: out, start: time.Now()}
	script := &Script{}
	if *scriptPath != "" {
		data, err := os.ReadFile(*scriptPath)
		if err != nil {
			log.Fatal(err)
		}
		if err := json.Unmarshal(data, script); err != nil {
			log.Fatalf("%s: %v", *scriptPath, err)
		}
	}
	var err error
	if *dial != "" {
		err = runClient(rec, script)
	} else {
		err = runServer(rec, script)
	}
	if err != nil {
		log.Fatal(err)
	}
}
